package console

// Names the external tests (package console_test) need.
const (
	SessionCookie = sessionCookie
	LoginCookie   = loginCookie
	LoginTTL      = loginTTL
)
