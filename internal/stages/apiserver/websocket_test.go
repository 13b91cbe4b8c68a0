package apiserver

import (
	"errors"
	"net"
	"testing"
)

// TestHandshakeConn: the connection a WebSocket watch's handler takes over
// keeps the handshake's status, whatever the writes' boundaries, and
// refuses what follows it.
func TestHandshakeConn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
		want   int
	}{
		{"refused", []string{"HTTP/1.1 403 Forbidden\r\n\r\n"}, 403},
		{"switched, in pieces", []string{"HTTP/1.1 101 Switching", " Protocols\r\nUpgrade: websocket\r\n", "\r\n"}, 101},
		{"not a status line", []string{"hello\r\n\r\n"}, -1},
		{"nothing written", nil, 0},
		{"headers not ended", []string{"HTTP/1.1 101 Switching Protocols\r\n"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &handshakeConn{}
			for _, w := range tc.writes {
				if _, err := c.Write([]byte(w)); err != nil {
					t.Fatal(err)
				}
			}
			if got := c.status(); got != tc.want {
				t.Errorf("status = %d, want %d", got, tc.want)
			}
			if tc.want != 0 {
				if _, err := c.Write([]byte("frame")); !errors.Is(err, net.ErrClosed) {
					t.Errorf("a write after the handshake: %v, want net.ErrClosed", err)
				}
			}
		})
	}
}
