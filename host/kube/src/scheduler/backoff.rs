//! Back-off for the watches. kube-runtime's `default_backoff` resets its delay on every `Ok` item,
//! and the watcher yields `Event::Init` before each list it tries: a list that fails every time (an
//! optional API the cluster does not serve: another project's CRD, a DRA version) was retried every
//! 0.8–1.6 s forever. Ten such kinds took 6–7 requests a second of the client's budget (50 by
//! default), so binds went at 44 a second against a limit of 50 on a real API server. Here only
//! progress — a list completed or a change seen — resets the delay.

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};

/// The first wait after a failure, doubled after each further one up to [`LONGEST`].
const FIRST: Duration = Duration::from_millis(800);
/// The longest wait between tries (kube-runtime's and client-go's reflector's cap).
const LONGEST: Duration = Duration::from_secs(30);

/// How long to wait before polling a watch again, from what it yielded last.
#[derive(Debug, Default)]
struct Delay {
    next: Duration,
}

impl Delay {
    /// The wait after `item`: after a failure the previous doubled (at least [`FIRST`]); none
    /// after progress; unchanged when a (re-)list merely starts.
    fn after<K>(&mut self, item: &watcher::Result<Event<K>>) -> Duration {
        self.next = match item {
            Err(_) => (self.next * 2).clamp(FIRST, LONGEST),
            Ok(Event::Init) => return Duration::ZERO,
            Ok(_) => Duration::ZERO,
        };
        self.next
    }
}

/// `stream`, waiting after each failure as [`Delay`] says; every item is passed on (errors are
/// logged by the caller).
pub(super) fn backoff_until_progress<K, S>(stream: S) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
    K: Send + 'static,
{
    futures_util::stream::unfold(
        (stream.boxed(), Delay::default(), Duration::ZERO),
        |(mut stream, mut delay, wait)| async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let item = stream.next().await?;
            let wait = delay.after(&item);
            Some((item, (stream, delay, wait)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> watcher::Result<Event<()>> {
        let status = kube::core::Status::failure("404 page not found", "").with_code(404);
        Err(watcher::Error::InitialListFailed(kube::Error::Api(status.boxed())))
    }

    #[test]
    fn a_list_that_keeps_failing_waits_longer_each_time_and_progress_starts_over() {
        let mut d = Delay::default();
        let mut waits = Vec::new();
        for _ in 0..8 {
            // Each try: the watcher announces a list, then the list fails.
            assert_eq!(d.after(&Ok(Event::<()>::Init)), Duration::ZERO);
            waits.push(d.after(&failed()).as_millis());
        }
        assert_eq!(waits, [800, 1600, 3200, 6400, 12_800, 25_600, 30_000, 30_000]);
        // Installed: the list completes; the next failure starts from the first wait again.
        assert_eq!(d.after(&Ok(Event::<()>::InitDone)), Duration::ZERO);
        assert_eq!(d.after(&failed()), FIRST);
        assert_eq!(d.after(&Ok(Event::Apply(()))), Duration::ZERO);
        assert_eq!(d.after(&failed()), FIRST);
    }

    #[tokio::test]
    async fn every_item_is_passed_on_in_order() {
        let items = vec![Ok(Event::Init), Ok(Event::InitApply(1)), Ok(Event::InitDone), Ok(Event::Apply(2))];
        let out: Vec<_> = backoff_until_progress(futures_util::stream::iter(items)).collect().await;
        let kinds: Vec<&str> = out
            .iter()
            .map(|e| match e {
                Ok(Event::Init) => "init",
                Ok(Event::InitApply(_)) => "init-apply",
                Ok(Event::InitDone) => "init-done",
                Ok(Event::Apply(_)) => "apply",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["init", "init-apply", "init-done", "apply"]);
    }
}
