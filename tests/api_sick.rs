//! A sick API server (issue 15 §1): answers of 500 and 429, refused and hung connections.
//! reaplet backs off like client-go's reflector, honours Retry-After, and one hung request
//! never holds back another pod's termination.

mod common;
