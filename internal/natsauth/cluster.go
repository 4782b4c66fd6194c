package natsauth

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// Cluster makes the server one node of a NATS cluster. Every node of a
// cluster is meant to load a file rendered from the same Options (the
// same users and permissions), so that a tenant is held to the same rules
// whichever node it connects to, and a message crosses from node to node
// only over routes between nodes that hold the route password.
type Cluster struct {
	// Name is the cluster's name, the same on every node: 1 to 64
	// characters from A-Z, a-z, 0-9, '_' and '-'.
	Name string
	// Listen is the address the node takes routes from the other nodes on,
	// such as "0.0.0.0:6222" (port -1 picks a free one, for tests).
	Listen string
	// User and Password authenticate the nodes to one another: a node
	// takes a route only from a peer that presents them, and presents them
	// when it dials its peers. The password is therefore Plain or Env,
	// never Bcrypt (a node must be able to send it).
	User     string
	Password Password
	// Routes are the cluster addresses (host:port) of the nodes to dial.
	// Listing every node, this one included, is fine: a node recognises a
	// route to itself and drops it, so one list serves every node. Each
	// route URL carries the password, which is why Routes needs a Plain
	// password; with Env use RoutesEnv. Nodes learn of the others' peers
	// from each other, so listing one node that is up is enough to join.
	Routes []string
	// RoutesEnv names an environment variable that holds the route URLs
	// instead, password included, as a bracketed list such as
	//   [nats-route://route:secret@nats1:6222, nats-route://route:secret@nats2:6222]
	// which the server reads when it loads the file, like Env passwords.
	RoutesEnv string
	// NoAdvertise stops the node from telling its clients the client
	// addresses of the other nodes. Leave it off when clients should learn
	// the cluster from any one node; set it when clients are given every
	// node and the addresses the nodes see themselves at mean nothing to
	// them (containers behind published ports, say).
	NoAdvertise bool
}

var clusterNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// render writes the cluster block, or says what is wrong with c.
func (c *Cluster) render(b *strings.Builder) error {
	if !clusterNameRe.MatchString(c.Name) {
		return fmt.Errorf("natsauth: cluster: name %q: use 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'", c.Name)
	}
	if err := checkAddr(c.Listen, true); err != nil {
		return fmt.Errorf("natsauth: cluster: listen %q: %w", c.Listen, err)
	}
	if !userRe.MatchString(c.User) {
		return fmt.Errorf("natsauth: cluster: user %q: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '-', '.' and '@'", c.User)
	}
	if c.Password.kind == bcryptPassword {
		return errors.New("natsauth: cluster: password: a node sends it when it dials its peers, so it cannot be a bcrypt hash: use Plain or Env")
	}
	pw, err := c.Password.render()
	if err != nil {
		return fmt.Errorf("natsauth: cluster: password: %w", err)
	}
	if len(c.Routes) > 0 && c.RoutesEnv != "" {
		return errors.New("natsauth: cluster: give Routes or RoutesEnv, not both")
	}
	if len(c.Routes) > 0 && c.Password.kind != plainPassword {
		return errors.New("natsauth: cluster: routes: each route URL carries the password, which here comes from the environment: list them in RoutesEnv")
	}
	if c.RoutesEnv != "" && !envNameRe.MatchString(c.RoutesEnv) {
		return fmt.Errorf("natsauth: cluster: routes environment variable name %q: use A-Z, 0-9 and '_', not starting with a digit", c.RoutesEnv)
	}
	routes := make([]string, len(c.Routes))
	for i, r := range c.Routes {
		if err := checkAddr(r, false); err != nil {
			return fmt.Errorf("natsauth: cluster: route[%d] %q: %w", i, r, err)
		}
		u := url.URL{Scheme: "nats-route", User: url.UserPassword(c.User, c.Password.value), Host: r}
		routes[i] = quote(u.String())
	}

	b.WriteString("cluster {\n")
	fmt.Fprintf(b, "  name: %s\n", quote(c.Name))
	fmt.Fprintf(b, "  listen: %s\n", quote(c.Listen))
	b.WriteString("  # Nodes take routes only from one another: each dials the others as\n")
	b.WriteString("  # this user.\n")
	fmt.Fprintf(b, "  authorization {user: %s, password: %s}\n", quote(c.User), pw)
	switch {
	case c.RoutesEnv != "":
		b.WriteString("  # The route URLs carry the route password, so they come from the\n")
		fmt.Fprintf(b, "  # environment too: %s=[nats-route://%s:<password>@<host>:<port>, ...]\n", c.RoutesEnv, c.User)
		fmt.Fprintf(b, "  routes: $%s\n", c.RoutesEnv)
	case len(routes) > 0:
		b.WriteString("  # Every node of the cluster; a node drops the route to itself.\n")
		b.WriteString("  routes = [\n")
		for _, r := range routes {
			b.WriteString("    " + r + "\n")
		}
		b.WriteString("  ]\n")
	}
	if c.NoAdvertise {
		b.WriteString("  # Clients are given every node; the addresses the nodes see\n")
		b.WriteString("  # themselves at mean nothing to them.\n")
		b.WriteString("  no_advertise: true\n")
	}
	b.WriteString("}\n\n")
	return nil
}

// checkAddr checks a host:port address; the host may be empty only for a
// listen address, and the port may be -1 (a free one) only there too (0
// would turn the cluster off).
func checkAddr(addr string, listen bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want host:port")
	}
	if host == "" && !listen {
		return errors.New("no host")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n > 65535 || n == 0 || n < -1 || (n < 0 && !listen) {
		return fmt.Errorf("port %q", port)
	}
	return nil
}
