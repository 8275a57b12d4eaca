//! Gradients summed in place, and the in-place loops the optimizer runs over them.
//!
//! A step's gradients arrive piecemeal: per micro-batch, per recomputed layer, per chunk of
//! the head (whose weight, tied to the embeddings in many models, is 49,152 × 576 floats).
//! Summing them as tensors (`earlier + new`) allocates a fresh copy per addition, and on
//! this allocator a fresh 100 MB tensor is fresh pages: page faults and zeroing were a
//! sixth of a step's time. Here each variable's sum is one buffer, added to in place.

use candle_core::backend::BackendStorage;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor, TensorId, Var};
use std::collections::HashMap;
use wirl_engine::Comm;

/// The summed gradients of some variables, one `f32` buffer each.
#[derive(Default)]
pub struct Gradients {
    sums: HashMap<TensorId, (Vec<f32>, Shape)>,
}

impl Gradients {
    pub fn new() -> Self {
        Gradients::default()
    }

    /// Take the gradients of `vars` out of `store` (leaving the intermediate tensors'
    /// gradients there), adding each into its sum. Returns how many `vars` had one.
    pub fn absorb<'a>(&mut self, store: &mut GradStore, vars: impl IntoIterator<Item = &'a Var>) -> Result<usize> {
        let mut taken = 0;
        for var in vars {
            let Some(grad) = store.remove(var.as_tensor()) else { continue };
            taken += 1;
            match self.sums.get_mut(&var.as_tensor().id()) {
                Some((sum, shape)) => {
                    if grad.shape() != shape {
                        candle_core::bail!("a gradient of shape {:?} for a variable of shape {shape:?}", grad.shape());
                    }
                    with_f32(&grad, |grad| {
                        in_parts(sum, |start, part| add(part, &grad[start..]));
                        Ok(())
                    })?;
                }
                None => {
                    let sum = with_f32(&grad, |grad| Ok(grad.to_vec()))?;
                    self.sums.insert(var.as_tensor().id(), (sum, grad.shape().clone()));
                }
            }
        }
        Ok(taken)
    }

    /// Add into `var`'s sum with `f`, which is handed the sum (zeros if nothing reached
    /// `var` yet): for gradients that a product writes straight into it.
    pub(crate) fn add_with(&mut self, var: &Var, f: impl FnOnce(&mut [f32])) {
        let (sum, _) = self
            .sums
            .entry(var.as_tensor().id())
            .or_insert_with(|| (vec![0f32; var.elem_count()], var.shape().clone()));
        f(sum);
    }

    /// The summed gradient of `var`, if any reached it.
    pub fn get(&self, var: &Var) -> Option<&[f32]> {
        self.sums.get(&var.as_tensor().id()).map(|(sum, _)| sum.as_slice())
    }

    /// The summed gradient of `var` as a tensor (a copy, on the CPU), if any reached it.
    pub fn tensor(&self, var: &Var) -> Result<Option<Tensor>> {
        self.sums
            .get(&var.as_tensor().id())
            .map(|(sum, shape)| Tensor::from_slice(sum, shape, &candle_core::Device::Cpu))
            .transpose()
    }

    pub fn is_empty(&self) -> bool {
        self.sums.is_empty()
    }

    /// Sum every rank's gradients of `vars` across `ranks` (data parallelism): afterwards
    /// each rank holds the same sums, for every variable any rank had a gradient for (one
    /// that none had stays absent, as on one rank). Every rank calls this with the same
    /// `vars` in the same order. `extra` values (counts, flags) are summed alongside and
    /// returned. The gradients travel in buckets of at most [`BUCKET_VALUES`] in `vars`'
    /// order: one collective per bucket, not per variable (a few hundred small messages
    /// would each pay the transport's latency), yet never a second copy of all gradients.
    pub fn all_reduce(&mut self, vars: &[&Var], ranks: &dyn Comm, extra: &[f32]) -> Result<Vec<f32>> {
        let reduce = |mut values: Vec<f32>| -> Result<Vec<f32>> {
            ranks.all_reduce_sum_in_place(&mut values).map_err(candle_core::Error::wrap)?;
            Ok(values)
        };
        // Which variables any rank has a gradient for, and the extras.
        let mut head: Vec<f32> = vars.iter().map(|v| f32::from(u8::from(self.get(v).is_some()))).collect();
        head.extend_from_slice(extra);
        let head = reduce(head)?;
        let (present, extra) = head.split_at(vars.len());
        let present: Vec<&Var> = vars.iter().zip(present).filter(|&(_, &p)| p > 0.0).map(|(v, _)| *v).collect();
        let mut start = 0;
        while start < present.len() {
            // The variables of this bucket (at least one, however large).
            let mut end = start + 1;
            let mut size = present[start].elem_count();
            while end < present.len() && size + present[end].elem_count() <= BUCKET_VALUES {
                size += present[end].elem_count();
                end += 1;
            }
            let mut bucket = Vec::with_capacity(size);
            for var in &present[start..end] {
                match self.get(var) {
                    Some(sum) => bucket.extend_from_slice(sum),
                    None => bucket.resize(bucket.len() + var.elem_count(), 0.0),
                }
            }
            let summed = reduce(bucket)?;
            let mut offset = 0;
            for var in &present[start..end] {
                let part = &summed[offset..offset + var.elem_count()];
                // Into the existing buffer where there is one (no fresh allocation).
                match self.sums.get_mut(&var.as_tensor().id()) {
                    Some((sum, _)) => sum.copy_from_slice(part),
                    None => {
                        self.sums.insert(var.as_tensor().id(), (part.to_vec(), var.shape().clone()));
                    }
                }
                offset += part.len();
            }
            start = end;
        }
        Ok(extra.to_vec())
    }
}

/// The most gradient values summed across ranks in one collective (64 MiB of f32).
pub const BUCKET_VALUES: usize = 16 << 20;

fn add(sum: &mut [f32], grad: &[f32]) {
    for (s, g) in sum.iter_mut().zip(grad) {
        *s += g;
    }
}

/// Run `f` over the values of `tensor` as one `f32` slice: borrowed where it is a contiguous
/// `f32` tensor on the CPU, a copy otherwise.
pub(crate) fn with_f32<R>(tensor: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    {
        let (storage, layout) = tensor.storage_and_layout();
        if let (candle_core::Storage::Cpu(CpuStorage::F32(values)), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            return f(&values[start..end]);
        }
    }
    let copy: Vec<f32> = tensor.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
    f(&copy)
}

/// Overwrite `tensor`'s values in place (its storage is shared: the engine's inference
/// model reads the policy's weights from it), `f(start, part)` for disjoint parts of them.
/// Contiguous `f32` tensors on the CPU only.
pub(crate) fn update_in_place(tensor: &Tensor, f: impl Fn(usize, &mut [f32]) + Sync) -> Result<()> {
    tensor.inplace_op1(&InPlace(f))
}

struct InPlace<F>(F);

impl<F: Fn(usize, &mut [f32]) + Sync> candle_core::InplaceOp1 for InPlace<F> {
    fn name(&self) -> &'static str {
        "wirl-in-place-update"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let CpuStorage::F32(values) = storage else {
            candle_core::bail!("an in-place update of a {:?} tensor (f32 only)", storage.dtype())
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("an in-place update of a tensor that is not contiguous")
        };
        in_parts(&mut values[start..end], &self.0);
        Ok(())
    }
}

/// Apply `f(start, part)` to disjoint parts of `values`, on as many threads as there are
/// cores when there is enough to share: these loops are bound by memory bandwidth, which
/// one core does not exhaust.
pub(crate) fn in_parts(values: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync) {
    in_row_parts(values, 1, 1, f);
}

/// [`in_parts`] over rows of `row_len` values, each costing about `work_per_row` values'
/// worth of work: `f(first_row, rows)`, parts cut between rows.
pub(crate) fn in_row_parts(
    values: &mut [f32],
    row_len: usize,
    work_per_row: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    let rows = values.len() / row_len.max(1);
    let threads = threads_for(rows * work_per_row).min(rows).max(1);
    if threads == 1 {
        return f(0, values);
    }
    let span = rows.div_ceil(threads);
    std::thread::scope(|scope| {
        for (k, part) in values.chunks_mut(span * row_len).enumerate() {
            let f = &f;
            scope.spawn(move || f(k * span, part));
        }
    });
}

/// Threads for a loop over `len` values: one per core, each with at least 256 Ki values
/// (below that, starting a thread costs more than it saves).
fn threads_for(len: usize) -> usize {
    const PER_THREAD: usize = 1 << 18;
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(len / PER_THREAD).max(1)
}

/// Sum of squares of `values` in f64, by parts as [`in_parts`] shares them.
pub(crate) fn sum_of_squares(values: &[f32]) -> f64 {
    let squares = |part: &[f32]| part.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
    let threads = threads_for(values.len());
    if threads == 1 {
        return squares(values);
    }
    let span = values.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = values.chunks(span).map(|part| scope.spawn(move || squares(part))).collect();
        parts.into_iter().map(|p| p.join().expect("a sum of squares does not panic")).sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn sums_in_place_what_backward_passes_return() {
        let a = Var::new(&[1.0f32, 2.0, 3.0], &Device::Cpu).unwrap();
        let b = Var::new(&[[1.0f32, -1.0], [0.5, 2.0]], &Device::Cpu).unwrap();
        let mut grads = Gradients::new();
        for k in 1..=3 {
            let loss = ((a.as_tensor() * k as f64).unwrap().sum_all().unwrap()
                + b.as_tensor().sqr().unwrap().sum_all().unwrap())
            .unwrap();
            let mut store = loss.backward().unwrap();
            assert_eq!(grads.absorb(&mut store, [&a, &b]).unwrap(), 2);
            assert!(store.get(a.as_tensor()).is_none() && store.get(b.as_tensor()).is_none());
        }
        assert_eq!(grads.get(&a).unwrap(), [6.0, 6.0, 6.0]);
        assert_eq!(grads.get(&b).unwrap(), [6.0, -6.0, 3.0, 12.0]);
        assert_eq!(grads.tensor(&b).unwrap().unwrap().dims(), [2, 2]);
    }

    #[test]
    fn parts_cover_every_value_once() {
        let mut values = vec![0f32; (1 << 19) + 7];
        in_parts(&mut values, |start, part| {
            for (i, v) in part.iter_mut().enumerate() {
                *v += (start + i) as f32;
            }
        });
        assert!(values.iter().enumerate().all(|(i, &v)| v == i as f32));
        let expected: f64 = values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        assert!((sum_of_squares(&values) - expected).abs() <= expected * 1e-9);
    }

    #[test]
    fn an_in_place_update_is_seen_through_every_tensor_on_the_storage() {
        let var = Var::new(&[1.0f32, 2.0], &Device::Cpu).unwrap();
        let reader = var.as_tensor().detach();
        update_in_place(var.as_tensor(), |_, part| part.iter_mut().for_each(|v| *v *= 10.0)).unwrap();
        assert_eq!(reader.to_vec1::<f32>().unwrap(), [10.0, 20.0]);
    }
}
