//! Why an exchange failed and on which side (Pingora's `ErrorSource`). One type for both
//! drivers, and the one mapping from a side and a cause onto the `outcome` column
//! ([`ExchangeError::outcome`]) and onto what serve answers with
//! ([`ExchangeError::answer`]: 400, 408, 502, 503, 504).

use http::StatusCode;

use crate::model::{Outcome, Side};

/// What went wrong, whichever side it was on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Connect, TLS, reset, a malformed or cut message, a peer that went away.
    Transport,
    /// One of serve's deadlines passed (`--upstream-timeout`, `--upstream-idle-timeout`).
    Deadline,
    /// Cut at the end of serve's shutdown grace period.
    Shutdown,
    /// serve: the client framed its request body wrong (answered 400).
    Malformed,
}

/// A failed exchange: the side, the cause, and a message naming the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExchangeError {
    pub(crate) side: Side,
    pub(crate) cause: Cause,
    pub(crate) message: String,
}

/// What serve answers a client whose exchange failed before the response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    /// The error `type` of the JSON body.
    pub(crate) kind: &'static str,
}

/// The message of an exchange cut at the end of the shutdown grace period.
const SHUTDOWN_CUT: &str = "cut at the end of the shutdown grace period";
/// The message of an exchange whose client went away.
const CLIENT_GONE: &str = "the client went away before the response ended";

impl ExchangeError {
    /// The worker's side failed at `context` (`connect to 127.0.0.1:8000`, ...).
    pub(crate) fn upstream(context: &str, err: &(dyn std::error::Error + 'static)) -> Self {
        Self::upstream_message(format!("{context}: {}", error_chain(err)))
    }

    /// The worker's side failed, as `message` says.
    pub(crate) fn upstream_message(message: String) -> Self {
        ExchangeError {
            side: Side::Upstream,
            cause: Cause::Transport,
            message,
        }
    }

    /// The worker did not answer (or finish) within one of our deadlines.
    pub(crate) fn deadline(message: String) -> Self {
        ExchangeError {
            side: Side::Upstream,
            cause: Cause::Deadline,
            message,
        }
    }

    /// serve: the client went away before its response ended.
    pub(crate) fn client_gone() -> Self {
        ExchangeError {
            side: Side::Downstream,
            cause: Cause::Transport,
            message: CLIENT_GONE.into(),
        }
    }

    /// serve: the client closed its connection while its request waited for the
    /// worker's response head (the upstream exchange is cancelled).
    pub(crate) fn client_gone_before_head() -> Self {
        ExchangeError {
            side: Side::Downstream,
            cause: Cause::Transport,
            message: "the client closed its connection before the worker's response head came; the upstream request was cancelled".into(),
        }
    }

    /// serve: the client's request body could not be read to its end (`what`: it closed
    /// its connection, or framed the body wrong); the upstream request was abandoned.
    pub(crate) fn client_request_body(what: &str) -> Self {
        ExchangeError {
            side: Side::Downstream,
            cause: Cause::Transport,
            message: format!("the client's request body could not be read: {what}"),
        }
    }

    /// serve: the client did not send its whole request body within `--upstream-timeout`
    /// (the worker never had the whole request: the client's fault, answered 408).
    pub(crate) fn client_body_timeout(seconds: f64) -> Self {
        ExchangeError {
            side: Side::Downstream,
            cause: Cause::Deadline,
            message: format!(
                "client_body_timeout: the client did not send its whole request body within --upstream-timeout ({seconds} s); answered 408"
            ),
        }
    }

    /// serve: the client framed its request body wrong (`what`); answered 400 and the
    /// connection closed.
    pub(crate) fn client_malformed_body(what: &str) -> Self {
        ExchangeError {
            side: Side::Downstream,
            cause: Cause::Malformed,
            message: format!("the client's request body is malformed ({what}); answered 400"),
        }
    }

    /// serve: cut at the end of the shutdown grace period.
    pub(crate) fn shutdown_cut() -> Self {
        ExchangeError {
            side: Side::Internal,
            cause: Cause::Shutdown,
            message: SHUTDOWN_CUT.into(),
        }
    }

    /// The `outcome` column of this failure.
    pub(crate) fn outcome(&self) -> Outcome {
        match (self.side, self.cause) {
            // The client's own slowness or bad framing ended its exchange.
            (Side::Downstream, Cause::Deadline | Cause::Malformed) => Outcome::ClientAborted,
            (_, Cause::Deadline) => Outcome::Timeout,
            (_, Cause::Shutdown) => Outcome::ShutdownCut,
            (Side::Downstream, Cause::Transport) => Outcome::ClientAborted,
            (Side::Upstream | Side::Internal, Cause::Transport | Cause::Malformed) => {
                Outcome::Transport
            }
        }
    }

    /// What serve answers a client whose exchange failed before the response head: the
    /// status and the error `type` of its JSON body.
    pub(crate) fn answer(&self) -> Answer {
        let (status, kind) = match (self.side, self.cause) {
            (Side::Downstream, Cause::Deadline) => {
                (StatusCode::REQUEST_TIMEOUT, "client_body_timeout")
            }
            (Side::Downstream, Cause::Malformed) => (StatusCode::BAD_REQUEST, "bad_request"),
            (_, Cause::Deadline) => (StatusCode::GATEWAY_TIMEOUT, "gateway_timeout"),
            (_, Cause::Shutdown) => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            (_, Cause::Transport | Cause::Malformed) => (StatusCode::BAD_GATEWAY, "bad_gateway"),
        };
        Answer { status, kind }
    }
}

/// `err` and its sources joined by ": ", without repeating a source that the message
/// already contains.
pub(crate) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let m = e.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = e.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_side_and_cause_maps_to_one_outcome_and_status() {
        let io = std::io::Error::other("reset");
        let cases = [
            (
                ExchangeError::upstream("read", &io),
                Outcome::Transport,
                502,
            ),
            (
                ExchangeError::deadline("late".into()),
                Outcome::Timeout,
                504,
            ),
            (ExchangeError::client_gone(), Outcome::ClientAborted, 502),
            (ExchangeError::shutdown_cut(), Outcome::ShutdownCut, 503),
            (
                ExchangeError::client_body_timeout(1.0),
                Outcome::ClientAborted,
                408,
            ),
            (
                ExchangeError::client_malformed_body("bad chunk"),
                Outcome::ClientAborted,
                400,
            ),
        ];
        for (e, outcome, status) in cases {
            assert_eq!(
                (e.outcome(), e.answer().status.as_u16()),
                (outcome, status),
                "{e:?}"
            );
        }
        assert_eq!(ExchangeError::upstream("read", &io).message, "read: reset");
    }
}
