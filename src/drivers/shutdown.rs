//! The run's stop request. Ctrl-C or SIGTERM (cli's signal watcher) asks for it once; the
//! drivers read it where they decide (`is_requested`) and wait for it without polling
//! (`requested`): a watch channel, so a waiter that starts after the request still sees it.

use tokio::sync::watch;

/// Whether the run has been asked to stop, readable at once and awaitable.
#[derive(Debug)]
pub struct Shutdown(watch::Sender<bool>);

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown(watch::Sender::new(false))
    }
}

impl Shutdown {
    /// Ask the run to stop. True when it had been asked already (a second signal).
    pub fn request(&self) -> bool {
        self.0.send_replace(true)
    }

    /// Whether the run has been asked to stop.
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the run has been asked to stop (at once if it has been already).
    pub async fn requested(&self) {
        let mut asked = self.0.subscribe();
        // The sender is `self`: it outlives this wait, so the channel cannot close.
        let _ = asked.wait_for(|asked| *asked).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_request_wakes_a_waiter_and_one_made_before_the_wait_is_seen() {
        let stop = Arc::new(Shutdown::default());
        assert!(!stop.is_requested());
        let waiter = tokio::spawn({
            let stop = stop.clone();
            async move { stop.requested().await }
        });
        tokio::task::yield_now().await;
        assert!(!stop.request(), "the first request is the first");
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter woke")
            .expect("the waiter ran");
        assert!(stop.is_requested());
        assert!(stop.request(), "a second request says it is the second");
        // Asked already: a wait that starts now returns at once.
        tokio::time::timeout(Duration::from_secs(5), stop.requested())
            .await
            .expect("an earlier request is seen");
    }
}
