//! A per-thread bound on the memory that code written by someone else — a model's chat
//! template — may take while it runs on a thread of its own.
//!
//! A template is a program: three lines that double a string or a list sixty times ask for
//! exabytes in sixty instructions, which neither minijinja's fuel (instructions) nor an
//! output limit (bytes written) sees. Rust's collections cannot fail an allocation
//! gracefully (a refused one aborts the process), so the bound works the other way round:
//! [`BudgetAllocator`] counts what a budgeted thread holds, and a thread that would pass its
//! budget is stopped *before* the allocation — it sleeps for good, holding at most its
//! budget, and raises a flag that the thread waiting for it reads
//! ([`Budget::exceeded`]). Threads without a budget are not touched beyond a thread-local
//! read per allocation.
//!
//! The bound holds only where the binary installs [`BudgetAllocator`] as its global
//! allocator (`wirl` does; so does the integration test binary); elsewhere
//! [`BudgetAllocator::installed`] is false and callers say so.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The system allocator, counting what budgeted threads hold.
pub struct BudgetAllocator;

/// Set once the first allocation goes through a [`BudgetAllocator`].
static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Bytes this thread may still take; `isize::MAX`: no budget.
    static LEFT: Cell<isize> = const { Cell::new(isize::MAX) };
    /// The flag raised when this thread's budget is spent (null: none).
    static FLAG: Cell<*const AtomicBool> = const { Cell::new(std::ptr::null()) };
}

impl BudgetAllocator {
    /// Whether the process allocates through a [`BudgetAllocator`] (budgets hold).
    pub fn installed() -> bool {
        // Allocate once so that an installed allocator has certainly been called.
        drop(std::hint::black_box(Box::new(0u8)));
        INSTALLED.load(Ordering::Relaxed)
    }

    /// Count `bytes` against the thread's budget; a thread that would pass it stops here.
    fn charge(bytes: usize) {
        // `try_with`: during a thread's teardown the locals may be gone; nothing is charged.
        let _ = LEFT.try_with(|left| {
            let now = left.get();
            if now == isize::MAX {
                return;
            }
            let after = now.saturating_sub(isize::try_from(bytes).unwrap_or(isize::MAX));
            if after < 0 {
                stop_for_good();
            }
            left.set(after);
        });
    }

    fn refund(bytes: usize) {
        let _ = LEFT.try_with(|left| {
            let now = left.get();
            if now != isize::MAX {
                left.set(now.saturating_add(isize::try_from(bytes).unwrap_or(0)).min(isize::MAX - 1));
            }
        });
    }
}

/// The budgeted thread's end: the flag raised, then sleep without allocating. The memory
/// it holds (at most its budget) stays with it; the waiting thread has been told.
fn stop_for_good() -> ! {
    let _ = FLAG.try_with(|flag| {
        let flag = flag.get();
        if !flag.is_null() {
            // SAFETY: the pointer comes from an `Arc<AtomicBool>` that `Budget::enter`'s
            // caller keeps alive on this thread for as long as the budget is set, and this
            // thread never returns from here.
            unsafe { (*flag).store(true, Ordering::SeqCst) };
        }
    });
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

// SAFETY: every call is passed to `System` unchanged; the counting around it neither
// allocates nor unwinds.
unsafe impl GlobalAlloc for BudgetAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        Self::charge(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        Self::charge(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::refund(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            Self::charge(new_size - layout.size());
        } else {
            Self::refund(layout.size() - new_size);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// A budget for the thread that [enters](Budget::enter) it, and the flag its waiter reads.
#[derive(Clone)]
pub struct Budget {
    bytes: usize,
    exceeded: Arc<AtomicBool>,
}

impl Budget {
    pub fn new(bytes: usize) -> Self {
        Budget { bytes, exceeded: Arc::new(AtomicBool::new(false)) }
    }

    /// Put the calling thread under this budget until the guard is dropped. Call it on a
    /// thread made for the bounded work: a thread that passes its budget never returns.
    pub fn enter(&self) -> BudgetGuard {
        // The flag's `Arc` is handed to the thread as a raw pointer: a stopped thread must be
        // able to reach it for ever; the guard takes it back when the work ends normally.
        let flag = Arc::into_raw(self.exceeded.clone());
        FLAG.with(|f| f.set(flag));
        LEFT.with(|left| left.set(isize::try_from(self.bytes).unwrap_or(isize::MAX - 1)));
        BudgetGuard { flag }
    }

    /// Whether the thread under this budget was stopped for passing it.
    pub fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::SeqCst)
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Lifts a thread's budget when dropped ([`Budget::enter`]).
pub struct BudgetGuard {
    flag: *const AtomicBool,
}

impl Drop for BudgetGuard {
    fn drop(&mut self) {
        LEFT.with(|left| left.set(isize::MAX));
        FLAG.with(|f| f.set(std::ptr::null()));
        // SAFETY: `flag` came from `Arc::into_raw` in `enter`, and is taken back once.
        drop(unsafe { Arc::from_raw(self.flag) });
    }
}
