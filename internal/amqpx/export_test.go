package amqpx

// ForgetDeadLetterWarnings makes the process warn again, for a test of the warning.
func ForgetDeadLetterWarnings() { warnedVersions.Clear() }
