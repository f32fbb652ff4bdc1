package warren

// Metadata keys of the AMQP basic properties. Marshaler maps each property of a delivery to
// its key, and each key of a message back to the property, so that the properties survive
// handlers, retries, delays, the poison queue and a replay, and foreign AMQP clients see real
// properties. Values are strings: the timestamp in RFC 3339 (whole seconds, as AMQP keeps
// it), the priority in decimal (0–255), the expiration as AMQP writes it (milliseconds, in
// decimal).
const (
	MetadataContentType     = "amqp_content_type"
	MetadataContentEncoding = "amqp_content_encoding"
	MetadataCorrelationID   = "amqp_correlation_id"
	MetadataReplyTo         = "amqp_reply_to"
	MetadataType            = "amqp_type"
	MetadataAppID           = "amqp_app_id"
	MetadataUserID          = "amqp_user_id"
	MetadataTimestamp       = "amqp_timestamp"
	MetadataPriority        = "amqp_priority"
	MetadataExpiration      = "amqp_expiration"
)
