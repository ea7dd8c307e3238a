package brokertest

// ErrSettled is a second Ack, Nack or Term's error, for the tests.
var ErrSettled = errSettled
