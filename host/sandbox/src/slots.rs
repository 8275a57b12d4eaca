//! The pool's instance slots as a queue. The pooling allocator has a fixed number of component
//! instances for a whole process (`max_instances`); past it, instantiating fails. So every
//! store takes a slot before it is made and gives it back when dropped, and a store that finds
//! none free waits for one, up to its call's deadline: 300 threads scoring at once, or more
//! open episodes than slots, slow calls down instead of failing them (`instantiate`) by the
//! dozen. What still finds no slot within its deadline fails naming the limit.

use crate::Interrupter;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often a waiting store looks at the interrupter.
const POLL: Duration = Duration::from_millis(10);

pub(crate) struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
    total: usize,
}

/// One slot, given back when dropped (with its store).
pub(crate) struct Slot(Arc<Slots>);

/// Why no slot was had.
pub(crate) enum NoSlot {
    Interrupted,
    /// None came free within the wait: the message says so.
    Busy(String),
}

impl Slots {
    pub(crate) fn new(total: u32) -> Arc<Self> {
        let total = total as usize;
        Arc::new(Slots { free: Mutex::new(total), freed: Condvar::new(), total })
    }

    /// A slot, waiting up to `within` for one to come free.
    pub(crate) fn take(self: &Arc<Self>, within: Duration, interrupt: &Interrupter) -> Result<Slot, NoSlot> {
        let until = Instant::now() + within;
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if *free > 0 {
                *free -= 1;
                return Ok(Slot(self.clone()));
            }
            if interrupt.is_interrupted() {
                return Err(NoSlot::Interrupted);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NoSlot::Busy(format!(
                    "all {} instance slots of this process stayed in use for {} ms (open episodes, calls in flight \
                     and instances kept between calls hold one each): fewer at once, or a longer deadline",
                    self.total,
                    within.as_millis()
                )));
            }
            free = self.freed.wait_timeout(free, left.min(POLL)).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_pool_queues_then_names_the_limit() {
        let slots = Slots::new(2);
        let never = Interrupter::default();
        let first = slots.take(Duration::ZERO, &never).ok().unwrap();
        let _second = slots.take(Duration::ZERO, &never).ok().unwrap();
        // Freed while the third waits: it gets the slot.
        let giver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(first);
        });
        let _third = slots.take(Duration::from_secs(30), &never).ok().expect("a freed slot");
        giver.join().unwrap();
        match slots.take(Duration::from_millis(20), &never) {
            Err(NoSlot::Busy(message)) => assert!(message.contains("all 2 instance slots"), "{message}"),
            _ => panic!("a full pool gave a slot"),
        }
        let stop = Interrupter::default();
        stop.interrupt();
        assert!(matches!(slots.take(Duration::from_secs(30), &stop), Err(NoSlot::Interrupted)));
    }
}
