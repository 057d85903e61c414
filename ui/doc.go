// Package ui is inboxmq's operator web console: the inbox, the stale
// claims, the dead letters, the held keys and the runtime controls in a
// browser, doing what the runbook asks of inboxctl.
//
// [New] returns a [Console], an http.Handler: inboxctl ui serves it on
// loopback, and a worker can mount it on its own listener:
//
//	con, err := ui.New(&ui.Config{
//		DB:       pool,
//		AMQPURL:  amqpURL,
//		Queues:   []ui.Queue{{Name: "payments"}},
//		Token:    os.Getenv("INBOXCTL_UI_TOKEN"),
//		Logger:   logger,
//		BasePath: "/console",
//	})
//	if err != nil { … }
//	defer con.Close()
//	mux.Handle("/console/", http.StripPrefix("/console", con))
//
// # Pages
//
// The overview shows each queue's inbox rows by status, its oldest claim,
// stale claims, completions and failures of the last minutes, the depths of
// its work queue, retry tiers, DLQ and parked queue, its pause and
// concurrency with how many live workers obey them, the workers (as each
// announced itself: namespaces, version, controls on or off, live, stale
// or stopped), and the outbox backlog; it reloads itself. The inbox page
// finds a key exactly or by prefix and shows a row's whole story. The stale
// claims page runs the reconciler dry first and then for real. The dead
// letters page groups a DLQ's messages by reason, shows each body (pretty
// JSON, bounded) and its headers, and replays one, a selection, a group or
// all of them through the inbox, or purges the DLQ after a typed
// confirmation. The held keys page lists the ordering keys that strict
// ordered routes hold after a dead letter (age, head, reason, error, the
// messages parked behind it) and releases one (its head runs again first,
// then the parked messages in order) or skips its head, as inboxctl
// ordered does. The controls page pauses, resumes, limits concurrency and
// blocks or unblocks keys and prefixes, with what is in force, since when,
// and who obeys: each change says how many live workers obey it and warns
// when none does.
//
// # Safety
//
// Reading needs nothing; every change needs a signed-in operator: the
// operator signs in with the console's token (compared in constant time)
// and a name, and every form carries the session's CSRF token; cross-origin
// form posts are refused as well. Each change and each refusal is written
// as an audit line to the Logger (action, result, remote address, operator,
// keys) and counted in inboxmq_ui_actions_total{action,result}. Pages read
// with bounded queries (a statement timeout, limits, paging); dead letters
// are read without being removed. Message bodies are hostile input: they are
// escaped, never interpreted, and the pages send a Content-Security-Policy
// that allows no script at all. The broker's and the database's passwords
// never appear.
package ui
