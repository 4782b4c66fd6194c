package soak

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(c net.Conn, s string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(s + "\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return line, err
}

func TestProxyForwardsCutsRefusesAndDelays(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	require.NoError(t, err)
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	got, err := roundTrip(c, "hello")
	require.NoError(t, err)
	require.Equal(t, "hello\n", got)

	// Cut: the open connection breaks.
	require.Equal(t, 2, p.CutAll(), "both sides of one connection")
	_, err = roundTrip(c, "again")
	require.Error(t, err)

	// Refuse: a new connection is closed at once.
	p.SetRefuse(true)
	r, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	_, err = roundTrip(r, "refused")
	require.Error(t, err)
	r.Close()

	// Back, with a delay: it still answers.
	p.SetRefuse(false)
	p.SetDelay(5 * time.Millisecond)
	d, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer d.Close()
	got, err = roundTrip(d, "slow")
	require.NoError(t, err)
	require.Equal(t, "slow\n", got)
}

func TestTailBufferKeepsTheEnd(t *testing.T) {
	b := newTailBuffer(8)
	_, _ = b.Write([]byte("0123456789"))
	_, _ = b.Write([]byte("ab"))
	require.Equal(t, "[...]456789ab", b.String())
}
