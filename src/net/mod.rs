//! The network edge below the engine: listening sockets with a deep accept queue
//! ([`listener`]), TLS configurations ([`tls`]), and the timed byte stream every upstream
//! connection runs over ([`timed_io`]). Imports only the clock; knows nothing of HTTP
//! exchanges, plans or records.

pub(crate) mod listener;
pub(crate) mod timed_io;
pub(crate) mod tls;
