package natsbroker

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream API error codes that mean a quota or limit was hit.
var quotaCodes = map[jetstream.ErrorCode]bool{
	10023: true, // insufficient resources
	10026: true, // maximum consumers limit reached
	10027: true, // maximum number of streams reached
	10028: true, // insufficient memory resources
	10047: true, // insufficient storage resources
	10054: true, // message size exceeds maximum allowed
	10077: true, // store failed: maximum messages / bytes exceeded
}

// Classify maps a nats.go error to a trigger.BrokerError kind:
// "Permission" (authorization, permission violations, expired or revoked
// credentials), "Quota" (JetStream resource and stream limits, the
// server's connection/subscription/payload limits), "NotFound" (stream or
// consumer missing) and "Disconnected" (no connection, closed, timed out,
// no heartbeat). Everything else is "" (not classified).
func Classify(err error) string {
	if err == nil {
		return ""
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch {
		case quotaCodes[apiErr.ErrorCode]:
			return "Quota"
		case apiErr.ErrorCode == jetstream.JSErrCodeStreamNotFound,
			apiErr.ErrorCode == jetstream.JSErrCodeConsumerNotFound,
			apiErr.ErrorCode == jetstream.JSErrCodeConsumerDoesNotExist:
			return "NotFound"
		case apiErr.Code == 403 || apiErr.Code == 401:
			return "Permission"
		}
	}
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrPermissionViolation),
		errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked),
		errors.Is(err, nats.ErrAccountAuthExpired):
		return "Permission"
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound),
		errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerDoesNotExist):
		return "NotFound"
	case errors.Is(err, jetstream.ErrMaximumConsumersLimit), errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum),
		errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrMaxConnectionsExceeded),
		errors.Is(err, nats.ErrMaxAccountConnectionsExceeded), errors.Is(err, nats.ErrMaxSubscriptionsExceeded),
		errors.Is(err, nats.ErrSlowConsumer):
		return "Quota"
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrNoServers),
		errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrConnectionDraining), errors.Is(err, nats.ErrStaleConnection),
		errors.Is(err, jetstream.ErrConnectionClosed), errors.Is(err, jetstream.ErrServerShutdown),
		errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrMsgIteratorClosed), errors.Is(err, context.DeadlineExceeded):
		return "Disconnected"
	}
	// Server errors that nats.go passes on as plain text.
	msg := strings.ToLower(err.Error())
	switch {
	case strings.Contains(msg, "permissions violation"), strings.Contains(msg, "authorization violation"),
		strings.Contains(msg, "authentication expired"), strings.Contains(msg, "not authorized"):
		return "Permission"
	case strings.Contains(msg, "maximum") && (strings.Contains(msg, "exceeded") || strings.Contains(msg, "limit")),
		strings.Contains(msg, "insufficient resources"), strings.Contains(msg, "insufficient storage"),
		strings.Contains(msg, "quota"):
		return "Quota"
	}
	return ""
}
