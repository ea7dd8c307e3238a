package reconcile

// The defaults and errors the tests check against.
const (
	DefaultQPS             = defaultQPS
	DefaultBurst           = defaultBurst
	DefaultConflictRetries = defaultConflictRetries
	EventWarning           = eventWarning
)

var (
	ErrInvalidConfig  = errInvalidConfig
	ErrAlreadyRunning = errAlreadyRunning
	ErrTerminal       = errTerminal
)
