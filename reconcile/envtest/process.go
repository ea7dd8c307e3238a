package envtest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is one running etcd, kube-apiserver or kube-controller-manager.
// Its waiter goroutine (started by startProcess, owned by the process)
// closes done when the process exits.
type process struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error // exit status; read only after done is closed
}

// startProcess runs bin with args in its own process group, appending its
// output to logPath.
func startProcess(name, bin, logPath string, args []string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	fmt.Fprintf(logFile, "==== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Stdin = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Own process group, so stop can kill the process and anything it
		// spawned, and a terminal's Ctrl-C reaches only the test binary,
		// which then stops the environment in order.
		Setpgid: true,
		// If the thread that started us dies (test binary crashed, killed
		// by the go test timeout), the kernel kills the process.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig to the process group, waits up to grace for the process to
// exit, then kills the group. It returns once the process has exited.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	pgid := p.cmd.Process.Pid // Setpgid: the group id is the leader's pid
	_ = syscall.Kill(-pgid, sig)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	// The whole group, even if the leader is gone: a child might survive it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

// tail returns the last n lines of the process log.
func (p *process) tail(n int) string { return tailFile(p.logPath, n) }

// tailFile returns the last n lines of the file at path, or a note why it
// could not be read.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const maxRead = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > maxRead {
		if _, err := f.Seek(-maxRead, io.SeekEnd); err != nil {
			return fmt.Sprintf("(log unreadable: %v)", err)
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	return lastLines(string(data), n)
}

// lastLines returns the last n lines of s, without its final newline.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// errProcessExited is wrapped by errors of a process that exited during start.
var errProcessExited = errors.New("process exited")

// watchdog removes a temp dir once this process is gone, however it ends:
// a panic in a goroutine or the go test -timeout end a test binary without
// running a test's cleanups or deferred calls, and Pdeathsig only takes
// care of the processes. It is a /bin/sh whose standard input is a pipe
// of which only this process holds the write end (O_CLOEXEC: no other
// child inherits it): the kernel closes it when the process exits, sh
// reads end-of-file and removes the dir, retrying while the killed
// processes let go of it. Stop closes the pipe itself after removing the
// dir. The dir is passed in the environment, not on the command line, so
// that looking for the dir in command lines finds only the control plane.
type watchdog struct {
	w    *os.File
	done chan struct{} // closed once sh exited; its waiter goroutine owns cmd
}

const watchdogScript = `read -r _
i=0
while [ -e "$OPKIT_ENVTEST_DIR" ] && [ "$i" -lt 100 ]; do
	rm -rf -- "$OPKIT_ENVTEST_DIR" 2>/dev/null
	i=$((i+1))
	sleep 0.1
done`

func startWatchdog(dir string) (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close() // the child has its copy
	cmd := exec.Command("/bin/sh", "-c", watchdogScript)
	cmd.Env = []string{"OPKIT_ENVTEST_DIR=" + dir, "PATH=/usr/bin:/bin"}
	cmd.Stdin = r
	// Its own process group: a terminal's Ctrl-C must not end it before
	// the test binary it watches.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start watchdog: %w", err)
	}
	wd := &watchdog{w: w, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(wd.done)
	}()
	return wd, nil
}

// stop closes the pipe and waits for sh to exit (at once if the dir is
// gone).
func (wd *watchdog) stop() {
	wd.w.Close()
	<-wd.done
}
