package ui_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// One headless Chromium serves every end-to-end test of the package; each
// test opens its own tab in its own browser context (cookies apart).
var (
	browserOnce   sync.Once
	browserCtx    context.Context //nolint:containedctx // the browser's lifetime, shared by the tests
	browserCancel context.CancelFunc
	allocCancel   context.CancelFunc
	browserErr    error
	browserDir    string
)

// chromiumPath finds Debian's chromium (or another Chromium-based browser).
func chromiumPath() (string, error) {
	var err error
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		var p string
		if p, err = exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", err
}

func startBrowser() {
	path, err := chromiumPath()
	if err != nil {
		browserErr = err
		return
	}
	if browserDir, err = os.MkdirTemp("", "inboxmq-ui-chromium-"); err != nil {
		browserErr = err
		return
	}
	var allocCtx context.Context
	allocCtx, allocCancel = chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(browserDir),
	)
	browserCtx, browserCancel = chromedp.NewContext(allocCtx)
	browserErr = chromedp.Do(browserCtx) // starts the browser, bound to browserCtx
}

// closeBrowser stops the shared browser (TestMain calls it).
func closeBrowser() {
	if browserCancel != nil {
		browserCancel()
		allocCancel()
	}
	if browserDir != "" {
		_ = os.RemoveAll(browserDir)
	}
}

// tab is a browser tab of the test in a fresh browser context, and the
// count of JavaScript dialogs (alert, confirm) it opened.
type tab struct {
	t       *testing.T
	ctx     context.Context //nolint:containedctx // the tab's lifetime
	base    string
	dialogs *atomic.Int32
}

// newTab opens a tab on b's console. Without a browser it fails under CI
// and skips elsewhere.
func (b *testBundle) newTab(t *testing.T) *tab {
	t.Helper()
	browserOnce.Do(startBrowser)
	if browserErr != nil {
		if testenv.CI() {
			t.Fatalf("headless chromium is needed for the end-to-end tests (apt-get install chromium): %v", browserErr)
		}
		t.Skipf("no headless chromium (apt-get install chromium): %v", browserErr)
	}
	ctx, cancel := chromedp.NewContext(browserCtx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx)) // opens the tab
	tb := &tab{t: t, ctx: ctx, base: b.srv.URL, dialogs: new(atomic.Int32)}
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			tb.dialogs.Add(1)
		}
	}))
	return tb
}

// bounded returns a context for one step, bounded by the test timeout.
func (tb *tab) bounded() (context.Context, context.CancelFunc) {
	return context.WithTimeout(tb.ctx, testenv.Timeout())
}

func (tb *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := tb.bounded()
	defer cancel()
	require.NoError(tb.t, chromedp.Do(ctx, steps...))
}

// submit clicks sel, waits for the page it loads and returns its status.
func (tb *tab) submit(sel string) int64 {
	tb.t.Helper()
	ctx, cancel := tb.bounded()
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(sel)))
	require.NoError(tb.t, err)
	return resp.Status
}

func (tb *tab) text(sel string) string {
	tb.t.Helper()
	ctx, cancel := tb.bounded()
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(tb.t, err)
	return s
}

func (tb *tab) open(path string) {
	tb.t.Helper()
	tb.do(chromedp.Navigate(tb.base + path))
}

// login signs in through the login form.
func (tb *tab) login(operator string) {
	tb.t.Helper()
	tb.open("/login")
	tb.do(
		chromedp.SetValue(chromedp.CSS(`input[name=operator]`), operator),
		chromedp.SetValue(chromedp.CSS(`input[name=token]`), operatorToken),
	)
	require.EqualValues(tb.t, 200, tb.submit(`form button[type=submit]`))
	require.Equal(tb.t, operator, tb.text("#operator"))
}

func TestBrowser_OverviewAndFindKey(t *testing.T) {
	t.Parallel()
	b := setup(t, true, nil)
	b.exec(t, `INSERT INTO inboxmq_inbox (consumer, key, status, attempts, completed_at) VALUES ($1, 'order:42', 'completed', 1, now())`, b.queue)
	tb := b.newTab(t)
	tb.open("/")
	row := tb.text(`tr[data-queue="` + b.queue + `"]`)
	require.Contains(t, row, b.queue)
	tb.do(chromedp.Click(chromedp.CSS(`nav a[href="/inbox"]`)), chromedp.WaitVisible(chromedp.CSS("#find-key")))
	tb.do(chromedp.SetValue(chromedp.CSS(`#find-key input[name=key]`), "order:42"))
	require.EqualValues(t, 200, tb.submit(`#find-key button`))
	require.Equal(t, "completed", tb.text("#status"))
	require.Contains(t, tb.text("h1"), "order:42")
}

func TestBrowser_ReplayAbsorbedByInbox(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	settled := b.startWorker(t)
	b.pub.Publish(b.queue, []byte(`{"id":"42"}`), amqp.Publishing{MessageId: "first"})
	require.NoError(t, testenv.WaitChan(t, settled, "the first delivery handled"))
	b.deadLetter(t, "copy", "order:42", "exhausted: gateway down", []byte(`{"id":"42"}`))

	tb := b.newTab(t)
	tb.login("alice")
	tb.open("/dlq?queue=" + b.queue)
	letter := `.letter[data-message-id="copy"]`
	require.Contains(t, tb.text(letter+" .absorbed"), "absorbed as a duplicate")
	require.EqualValues(t, 200, tb.submit(letter+` button[name=one]`))
	require.Contains(t, tb.text("#flash"), "Replayed 1 of 1")

	require.True(t, isDuplicate(testenv.WaitChan(t, settled, "the replay handled")), "the inbox absorbs the replay")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE key = 'order:42'`))
	tb.open("/dlq?queue=" + b.queue)
	require.Contains(t, tb.text("#dlq-depth"), "0 messages")
}

func TestBrowser_BlockParksNextDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	tb := b.newTab(t)
	tb.login("alice")
	tb.open("/controls")
	tb.do(
		chromedp.SetValue(chromedp.CSS(`#block input[name=pattern]`), "order:7"),
		chromedp.SetValue(chromedp.CSS(`#block input[name=reason]`), "chargeback dispute"),
	)
	require.EqualValues(t, 200, tb.submit(`#block button`))
	require.Contains(t, tb.text("#flash"), `Blocked "order:7"`)
	require.Contains(t, tb.text(`tr[data-pattern="order:7"]`), "chargeback dispute")

	b.startWorker(t)
	b.pub.Publish(b.queue, []byte(`{"id":"7"}`), amqp.Publishing{MessageId: "m-7"})
	testenv.WaitFor(t, "the delivery parked", func() bool { return amqptest.DepthOrZero(t, b.conn, b.queue+".parked") == 1 })
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects`))
	tb.open("/")
	require.Contains(t, tb.text(`tr[data-queue="`+b.queue+`"]`), "1 blocked")
}

func TestBrowser_FormWithoutTokenRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, false, nil)
	tb := b.newTab(t)
	tb.open("/controls") // not signed in
	tb.do(chromedp.SetValue(chromedp.CSS(`#block input[name=pattern]`), "order:1"))
	require.EqualValues(t, 403, tb.submit(`#block button`))
	require.Contains(t, tb.text("#refused"), "operator token required")
	require.Zero(t, b.count(t, `SELECT count(*) FROM inboxmq_blocks`))
}

func TestBrowser_ScriptBodyShownAsText(t *testing.T) {
	t.Parallel()
	b := setup(t, true, nil)
	evil := `<script>alert("pwned")</script><img src=x onerror=alert(2)>`
	b.deadLetter(t, "evil", "order:<b>1</b>", "decode: <script>alert(3)</script>", []byte(evil))
	tb := b.newTab(t)
	tb.open("/dlq?queue=" + b.queue)
	letter := `.letter[data-message-id="evil"]`
	require.Equal(t, evil, tb.text(letter+" pre.body"), "the body is shown as text")
	require.Equal(t, "decode: <script>alert(3)</script>", tb.text(letter+" .reason"))
	require.True(t, strings.Contains(tb.text(letter), "order:<b>1</b>"))
	require.Zero(t, tb.dialogs.Load(), "no script ran")
	require.Equal(t, 1, amqptest.Depth(t, b.conn, b.dlq), "reading removes nothing")
}
