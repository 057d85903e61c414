package producer

import "net"

// OnDial makes p call f with every network connection it dials (before
// its first publish).
func OnDial(p *Producer, f func(net.Conn)) { p.dialed.Store(&f) }
