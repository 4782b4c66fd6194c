// Package natsconn opens the NATS connections of Harvest's processes, so
// that the gateway, the worker, the harvest command, `harvest dev` and the
// tools reach NATS with one set of options.
//
// HARVEST_NATS_URL names one server or the servers of a cluster
// (comma-separated). A connection starts on one of them at random, which
// spreads a fleet's processes over the nodes, and when its server goes
// away it moves to another at once, then keeps trying the list for as
// long as the process lives, with a random pause between rounds so that
// the clients of a dead node do not come back in step. It pings its
// server every few seconds, so a server that stopped answering without
// closing the connection (a machine gone, a network cut) is noticed in
// seconds, not in minutes. nats.go sends the connection's subscriptions
// again on every reconnect, so queue groups, wake-ups and run events
// resume by themselves; messages published while no server was reachable
// wait in the connection's reconnect buffer.
//
// Services return from Connect at once when no server answers yet and
// connect in the background, as a gateway must be able to start before
// NATS; one-shot commands set Options.FailFast and fail instead.
package natsconn
