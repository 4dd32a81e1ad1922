//! Client-side rate limiting, kube-scheduler's `clientConnection.qps` and `burst`: every request of
//! the scheduler's client waits for a token of one bucket (`burst` tokens, refilled at `qps` per
//! second) before it is sent, so a gang storm queues in the scheduler instead of drawing 429s from
//! the API server's priority levels. Leader election runs on a client of its own ([`Clients`]):
//! a renewal never waits behind the scheduler's own status writes.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::Client;
use tower::{Layer, Service};

/// Requests per second and burst of the scheduler's client.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClientRate {
    /// Sustained requests per second.
    pub qps: f64,
    /// Requests that may go at once after a quiet spell.
    pub burst: u32,
}

impl Default for ClientRate {
    /// kube-scheduler's defaults: 50 requests per second, bursts of 100.
    fn default() -> Self {
        ClientRate { qps: 50.0, burst: 100 }
    }
}

impl ClientRate {
    /// The rate as a bucket; `None` when `qps` is not a positive number (unlimited).
    fn quota(self) -> Option<Quota> {
        if !(self.qps.is_finite() && self.qps > 0.0) {
            return None;
        }
        let period = Duration::from_secs_f64(1.0 / self.qps).max(Duration::from_nanos(1));
        let burst = NonZeroU32::new(self.burst.max(1)).expect("at least 1");
        Some(Quota::with_period(period)?.allow_burst(burst))
    }
}

/// The scheduler's clients, as kube-scheduler keeps them: `api` for what it watches and writes,
/// `events` for Kubernetes events, each with a limit of its own, and `election` for its Lease alone.
#[derive(Clone)]
pub struct Clients {
    /// Watches, binds, evictions and status (rate-limited by the caller's stack).
    pub api: Client,
    /// Kubernetes events (best effort); `None`: through `api`.
    pub events: Option<Client>,
    /// The Lease: its own connection and no client-side limit shared with `api`.
    pub election: Client,
}

impl Clients {
    /// Both clients from the usual kubeconfig or in-cluster configuration, `api` limited to `rate`.
    pub async fn infer(rate: ClientRate) -> Result<Clients, kube::Error> {
        let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
        let limited = |config: kube::Config| -> Result<Client, kube::Error> {
            Ok(kube::client::ClientBuilder::try_from(config)?.with_layer(&ThrottleLayer::new(rate)).build())
        };
        let api = limited(config.clone())?;
        let events = Some(limited(config.clone())?);
        let election = Client::try_from(config)?;
        Ok(Clients { api, events, election })
    }
}

/// A [`Layer`] that makes each request wait for a token of one shared bucket.
#[derive(Clone)]
pub struct ThrottleLayer {
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
}

impl ThrottleLayer {
    /// One bucket of `rate` for every service this layer wraps.
    pub fn new(rate: ClientRate) -> ThrottleLayer {
        ThrottleLayer { limiter: rate.quota().map(|q| Arc::new(RateLimiter::direct(q))) }
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttled<S>;

    fn layer(&self, inner: S) -> Throttled<S> {
        Throttled { inner, limiter: self.limiter.clone(), wait: None, admitted: false }
    }
}

/// A service whose readiness waits for a token: kube's client drives it from one buffer worker,
/// so requests queue in order while the bucket refills.
pub struct Throttled<S> {
    inner: S,
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A token is taken for the next call.
    admitted: bool,
}

impl<S, R> Service<R> for Throttled<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Some(limiter) = &self.limiter {
            while !self.admitted {
                if let Some(wait) = self.wait.as_mut() {
                    ready!(wait.as_mut().poll(cx));
                    self.wait = None;
                }
                match limiter.check() {
                    Ok(()) => self.admitted = true,
                    Err(not_until) => {
                        let left = not_until.wait_time_from(DefaultClock::default().now());
                        self.wait = Some(Box::pin(tokio::time::sleep(left)));
                    }
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.admitted = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::time::Instant;

    /// A service that answers at once, counting calls.
    #[derive(Clone, Default)]
    struct Count(Arc<std::sync::atomic::AtomicU32>);

    impl Service<()> for Count {
        type Response = ();
        type Error = Infallible;
        type Future = std::future::Ready<Result<(), Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: ()) -> Self::Future {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::ready(Ok(()))
        }
    }

    async fn send(service: &mut Throttled<Count>) {
        std::future::poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        service.call(()).await.unwrap();
    }

    #[tokio::test]
    async fn a_burst_goes_at_once_and_the_rest_no_faster_than_the_rate() {
        let count = Count::default();
        let mut service = ThrottleLayer::new(ClientRate { qps: 50.0, burst: 5 }).layer(count.clone());
        for _ in 0..5 {
            send(&mut service).await;
        }
        let started = Instant::now();
        for _ in 0..10 {
            send(&mut service).await;
        }
        // Ten more at 50 per second cannot all go in less than 180 ms (the 10th token is due at 200).
        assert!(started.elapsed() >= Duration::from_millis(180), "{:?}", started.elapsed());
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 15);
    }

    #[test]
    fn a_rate_that_is_not_positive_is_unlimited() {
        assert!(ClientRate { qps: 0.0, burst: 1 }.quota().is_none());
        assert!(ClientRate { qps: f64::NAN, burst: 1 }.quota().is_none());
        assert!(ClientRate::default().quota().is_some());
    }
}
