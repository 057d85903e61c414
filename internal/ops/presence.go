package ops

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/inboxmq/inboxmq/control"
)

// Reach is who obeys a change of one namespace's controls, from the
// workers' presence rows: the live workers serving the namespace, split
// by whether their controls are on.
type Reach struct {
	// Namespace is the namespace the change is to.
	Namespace string `json:"-"`
	// Obeying are the IDs of the live workers that serve Namespace with
	// their controls on: they apply the change within 2 seconds.
	Obeying []string `json:"obeying"`
	// ControlsOff are the IDs of the live workers that serve Namespace
	// with their controls off: they ignore the change.
	ControlsOff []string `json:"controls_off"`
	// Known says whether a presence row (live, stale or stopped), a
	// control or a block names Namespace.
	Known bool `json:"-"`
	// Namespaces are every namespace known so, sorted.
	Namespaces []string `json:"-"`
}

// NewReach is the reach of a change of ns given the presence rows and
// the controls in force (snap may be nil).
func NewReach(ns string, workers []control.Presence, snap *control.Snapshot) Reach {
	r := Reach{Namespace: ns, Obeying: []string{}, ControlsOff: []string{}}
	known := map[string]bool{}
	for _, w := range workers {
		for _, n := range w.Namespaces {
			known[n] = true
		}
		if w.State != "live" || !slices.Contains(w.Namespaces, ns) {
			continue
		}
		if w.Controls {
			r.Obeying = append(r.Obeying, w.ID)
		} else {
			r.ControlsOff = append(r.ControlsOff, w.ID)
		}
	}
	if snap != nil {
		for _, c := range snap.Controls {
			known[c.Namespace] = true
		}
		for _, b := range snap.Blocks {
			known[b.Namespace] = true
		}
	}
	r.Known = known[ns]
	for n := range known {
		r.Namespaces = append(r.Namespaces, n)
	}
	slices.Sort(r.Namespaces)
	return r
}

// ReachOf reads the presence rows and the controls through s and returns
// the reach of a change of ns.
func ReachOf(ctx context.Context, s *control.Store, ns string) (Reach, error) {
	workers, err := s.Workers(ctx)
	if err != nil {
		return Reach{Namespace: ns}, err
	}
	snap, err := s.List(ctx)
	if err != nil {
		return Reach{Namespace: ns}, err
	}
	return NewReach(ns, workers, snap), nil
}

// Summary says how many live workers obey: "2 live workers obey",
// "1 live worker obeys", "no live worker obeys".
func (r Reach) Summary() string {
	switch n := len(r.Obeying); n {
	case 0:
		return "no live worker obeys"
	case 1:
		return "1 live worker obeys"
	default:
		return fmt.Sprintf("%d live workers obey", n)
	}
}

// Warning is what an operator must know about the change, or "" when at
// least one live worker obeys and none serving the namespace ignores it.
func (r Reach) Warning() string {
	off := len(r.ControlsOff)
	switch {
	case off == 0 && len(r.Obeying) == 0:
		return fmt.Sprintf("no live worker serves %s: nothing obeys the change until a worker serving it starts", r.Namespace)
	case off == 0:
		return ""
	case len(r.Obeying) == 0:
		return fmt.Sprintf("%s %s but %s controls off (%s): nothing obeys the change",
			liveWorkers(off), serve(off, r.Namespace), have(off), strings.Join(r.ControlsOff, ", "))
	default:
		return fmt.Sprintf("%s %s with controls off (%s) and %s the change",
			liveWorkers(off), serve(off, r.Namespace), strings.Join(r.ControlsOff, ", "), ignore(off))
	}
}

// Unknown returns an error naming the known namespaces when nothing
// names r.Namespace (a typo, or a namespace no worker ever served), and
// nil otherwise.
func (r Reach) Unknown() error {
	if r.Known {
		return nil
	}
	known := "none"
	if len(r.Namespaces) > 0 {
		known = strings.Join(r.Namespaces, ", ")
	}
	return fmt.Errorf("unknown namespace %q: no worker announced it and no control or block names it (known: %s)", r.Namespace, known)
}

// WorkersSummary counts the workers by state: "2 live workers (1 with
// controls off), 1 stale, 0 stopped".
func WorkersSummary(workers []control.Presence) string {
	var live, off, stale, stopped int
	for _, p := range workers {
		switch p.State {
		case "live":
			live++
			if !p.Controls {
				off++
			}
		case "stale":
			stale++
		default:
			stopped++
		}
	}
	noun := "workers"
	if live == 1 {
		noun = "worker"
	}
	s := fmt.Sprintf("%d live %s", live, noun)
	if off > 0 {
		s += fmt.Sprintf(" (%d with controls off)", off)
	}
	return s + fmt.Sprintf(", %d stale, %d stopped", stale, stopped)
}

func liveWorkers(n int) string {
	if n == 1 {
		return "1 live worker"
	}
	return fmt.Sprintf("%d live workers", n)
}

func serve(n int, ns string) string {
	if n == 1 {
		return "serves " + ns
	}
	return "serve " + ns
}

func have(n int) string {
	if n == 1 {
		return "has"
	}
	return "have"
}

func ignore(n int) string {
	if n == 1 {
		return "ignores"
	}
	return "ignore"
}
