//! Polls a connection again in place when it woke itself during its own poll, instead
//! of handing that wake-up to the runtime.
//!
//! Why this exists: hyper polls a request's handler inside its connection's task, so
//! a handler that reads its request body wakes that very task. The body channel wakes
//! the connection's dispatcher when the handler takes a chunk (even when the
//! dispatcher has already sent the whole body and let go of its end), and the
//! listener's [`crate::inbound::BodyClock`] wakes the race it runs beside the handler
//! when the body ends. Tokio requeues a task woken during its own poll as a *yield*,
//! at the back of the run queue, and wakes an idle worker to come and steal it: a
//! futex wake, a futex wait and two context switches for a request that had nothing
//! to wait for. Measured on a plain legacy `tools/call` (its handler reads the body;
//! a pass-through request's body is read by the upstream connection's task instead):
//! two futex calls per request, none for pass-through.
//!
//! [`SelfWakes::poll`] lends the inner future a waker of its own. A wake that comes
//! while the future is being polled, from this thread or another, only marks it; if
//! the poll ends pending with the mark set, the future is polled again at once, up to
//! [`REPOLLS`] times, after which the wake goes to the task as usual (a future that
//! keeps waking itself still yields). A wake that comes between polls goes straight
//! to the task. Nothing is lost: the mark is cleared before each poll and read after
//! it, and a wake never sees "being polled" after the poller has stopped looking.

use atomic_waker::AtomicWaker;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Polls in a row before a self-wake is handed to the runtime after all.
pub const REPOLLS: usize = 4;

/// One connection's wake-up filter; see the module docs.
#[derive(Debug)]
pub struct SelfWakes {
    shared: Arc<Shared>,
    /// `shared` as a waker, made once: the inner future's wakers then compare equal
    /// (`Waker::will_wake`) from poll to poll, and registering one clones nothing.
    waker: Waker,
}

#[derive(Debug, Default)]
struct Shared {
    /// The inner future is being polled right now.
    polling: AtomicBool,
    /// A wake came since the current (or last) poll began.
    woken: AtomicBool,
    /// The task to wake when the inner future is not being polled.
    task: AtomicWaker,
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Sequentially consistent on both sides (here, and `polling` then `woken` in
        // `poll`): either the poller sees the mark, or this sees it stopped polling.
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl Default for SelfWakes {
    fn default() -> Self {
        let shared = Arc::new(Shared::default());
        let waker = Waker::from(shared.clone());
        Self { shared, waker }
    }
}

impl SelfWakes {
    /// Polls `fut` on behalf of the task polling the caller (`cx`).
    pub fn poll<F: Future + ?Sized>(
        &self,
        mut fut: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        let shared = &self.shared;
        shared.task.register(cx.waker());
        let mut inner = Context::from_waker(&self.waker);
        for _ in 0..REPOLLS {
            shared.woken.store(false, Ordering::SeqCst);
            shared.polling.store(true, Ordering::SeqCst);
            let polled = fut.as_mut().poll(&mut inner);
            shared.polling.store(false, Ordering::SeqCst);
            if polled.is_ready() {
                return polled;
            }
            if !shared.woken.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
        }
        // Still waking itself: let the runtime schedule it like any other yield.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes its task gets.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Pending `pending` times, waking itself each time, then ready.
    struct SelfWaking {
        pending: usize,
        polls: usize,
    }

    impl Future for SelfWaking {
        type Output = usize;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.pending == 0 {
                return Poll::Ready(self.polls);
            }
            self.pending -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn task() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        (count, waker)
    }

    #[test]
    fn a_self_wake_is_polled_again_in_place() {
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        let sw = SelfWakes::default();
        let mut fut = SelfWaking {
            pending: 2,
            polls: 0,
        };
        assert_eq!(sw.poll(Pin::new(&mut fut), &mut cx), Poll::Ready(3));
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            0,
            "the task was never woken"
        );
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields() {
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        let sw = SelfWakes::default();
        let mut fut = SelfWaking {
            pending: usize::MAX,
            polls: 0,
        };
        assert!(sw.poll(Pin::new(&mut fut), &mut cx).is_pending());
        assert_eq!(fut.polls, REPOLLS);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "handed to the task once");
    }

    /// Another thread sets a flag and wakes, racing with the polls: every wake-up must
    /// reach the task (after a lost one, only the timeout wakes it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_wake_from_another_thread_is_lost() {
        for _ in 0..2_000 {
            let done = Arc::new(AtomicBool::new(false));
            let kept: Arc<std::sync::Mutex<Option<Waker>>> = Arc::default();
            let (d, k) = (done.clone(), kept.clone());
            let setter = std::thread::spawn(move || {
                std::thread::yield_now();
                d.store(true, Ordering::SeqCst);
                if let Some(w) = k.lock().expect("lock").take() {
                    w.wake();
                }
            });
            let sw = SelfWakes::default();
            let mut fut = std::future::poll_fn(|cx| {
                *kept.lock().expect("lock") = Some(cx.waker().clone());
                if done.load(Ordering::SeqCst) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            });
            let polled = std::future::poll_fn(|cx| sw.poll(Pin::new(&mut fut), cx));
            // Only the timer would wake the task after a lost wake-up (and find it done).
            let started = std::time::Instant::now();
            let _ = tokio::time::timeout(std::time::Duration::from_secs(3), polled).await;
            assert!(
                started.elapsed() < std::time::Duration::from_secs(2),
                "a wake-up was lost"
            );
            setter.join().expect("setter thread");
        }
    }

    #[test]
    fn a_wake_between_polls_reaches_the_task() {
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        let sw = SelfWakes::default();
        // Pending without waking itself: it keeps the waker it was given.
        let mut kept: Option<Waker> = None;
        let mut fut = std::future::poll_fn(|cx| {
            kept = Some(cx.waker().clone());
            Poll::<()>::Pending
        });
        assert!(sw.poll(Pin::new(&mut fut), &mut cx).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        let kept = kept.take().expect("polled once");
        std::thread::spawn(move || kept.wake())
            .join()
            .expect("waker thread");
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }
}
