//! Gradients summed in place, and the in-place loops the optimizer runs over them.
//!
//! A step's gradients arrive piecemeal: per micro-batch, per recomputed layer, per chunk of
//! the head (whose weight, tied to the embeddings in many models, is 49,152 × 576 floats).
//! Summing them as tensors (`earlier + new`) allocates a fresh copy per addition, and on
//! this allocator a fresh 100 MB tensor is fresh pages: page faults and zeroing were a
//! sixth of a step's time. Here each variable's sum is one buffer, added to in place.
//!
//! On a GPU the sums stay on the device as tensors: copying every piece to the host and
//! adding there (a 113 MB head gradient per chunk of the head) was most of a CUDA step's
//! backward (docs/BENCHMARKS.md, "The CUDA trainer on one H200"), and the GPU's allocator makes a fresh sum cheap.

use candle_core::backend::BackendStorage;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor, TensorId, Var};
use std::collections::HashMap;
use wirl_model::comm::Comm;

/// The summed gradients of some variables: one `f32` buffer each on the CPU, one `f32`
/// tensor each on the device where the gradients arrive on another device.
#[derive(Default)]
pub struct Gradients {
    sums: HashMap<TensorId, Sum>,
    /// Keep sums as tensors even of CPU gradients (the device path, testable on the CPU).
    tensors_always: bool,
}

enum Sum {
    Host(Vec<f32>),
    Device(Tensor),
}

/// One variable's summed gradient, where it is.
pub enum GradSum<'a> {
    Host(&'a [f32]),
    Device(&'a Tensor),
}

impl GradSum<'_> {
    /// The sum as a tensor of `shape` on `device` (a copy unless it is already there).
    pub fn to_tensor(&self, shape: &Shape, device: &candle_core::Device) -> Result<Tensor> {
        match self {
            GradSum::Host(values) => Tensor::from_slice(values, shape, device),
            GradSum::Device(tensor) => tensor.to_device(device)?.reshape(shape),
        }
    }

    /// Its sum of squares, in f64 on the host (f32 on a device, summed there).
    pub fn sum_of_squares(&self) -> Result<f64> {
        match self {
            GradSum::Host(values) => Ok(sum_of_squares(values)),
            GradSum::Device(tensor) => Ok(f64::from(tensor.sqr()?.sum_all()?.to_scalar::<f32>()?)),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            GradSum::Host(values) => values.len(),
            GradSum::Device(tensor) => tensor.elem_count(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Gradients {
    pub fn new() -> Self {
        Gradients::default()
    }

    /// Sums kept as tensors whatever the device: what every GPU's gradients get, here also
    /// for CPU ones (that path's tests run on the CPU).
    pub fn as_tensors() -> Self {
        Gradients { tensors_always: true, ..Gradients::default() }
    }

    /// Take the gradients of `vars` out of `store` (leaving the intermediate tensors'
    /// gradients there), adding each into its sum. Returns how many `vars` had one.
    pub fn absorb<'a>(&mut self, store: &mut GradStore, vars: impl IntoIterator<Item = &'a Var>) -> Result<usize> {
        let mut taken = 0;
        for var in vars {
            let Some(grad) = store.remove(var.as_tensor()) else { continue };
            taken += 1;
            self.add(var, grad)?;
        }
        Ok(taken)
    }

    /// Add `grad` (of `var`'s shape) into `var`'s sum.
    pub(crate) fn add(&mut self, var: &Var, grad: Tensor) -> Result<()> {
        if grad.shape() != var.shape() {
            candle_core::bail!("a gradient of shape {:?} for a variable of shape {:?}", grad.shape(), var.shape());
        }
        let on_device = self.tensors_always || !grad.device().is_cpu();
        match self.sums.get_mut(&var.as_tensor().id()) {
            Some(Sum::Device(sum)) => *sum = (&*sum + grad.to_dtype(DType::F32)?)?,
            Some(Sum::Host(sum)) => with_f32(&grad, |grad| {
                in_parts(sum, |start, part| add(part, &grad[start..]));
                Ok(())
            })?,
            None if on_device => {
                self.sums.insert(var.as_tensor().id(), Sum::Device(grad.to_dtype(DType::F32)?.contiguous()?));
            }
            None => {
                let sum = with_f32(&grad, |grad| Ok(grad.to_vec()))?;
                self.sums.insert(var.as_tensor().id(), Sum::Host(sum));
            }
        }
        Ok(())
    }

    /// Add into `var`'s sum with `f`, which is handed the sum (zeros if nothing reached
    /// `var` yet): for gradients that a product writes straight into it. A sum kept on a
    /// device is brought to the host first (these products run on the CPU).
    pub(crate) fn add_with(&mut self, var: &Var, f: impl FnOnce(&mut [f32])) -> Result<()> {
        let id = var.as_tensor().id();
        if let Some(Sum::Device(_)) = self.sums.get(&id) {
            self.bring_to_host(var)?;
        }
        match self.sums.entry(id).or_insert_with(|| Sum::Host(vec![0f32; var.elem_count()])) {
            Sum::Host(sum) => f(sum),
            Sum::Device(_) => candle_core::bail!("a gradient sum left on its device"),
        }
        Ok(())
    }

    /// Move `var`'s sum to the host, if it is on a device.
    fn bring_to_host(&mut self, var: &Var) -> Result<()> {
        let id = var.as_tensor().id();
        if let Some(Sum::Device(tensor)) = self.sums.get(&id) {
            let values = tensor.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            self.sums.insert(id, Sum::Host(values));
        }
        Ok(())
    }

    /// The summed gradient of `var`, if any reached it, where it is.
    pub fn sum(&self, var: &Var) -> Option<GradSum<'_>> {
        self.sums.get(&var.as_tensor().id()).map(|sum| match sum {
            Sum::Host(values) => GradSum::Host(values),
            Sum::Device(tensor) => GradSum::Device(tensor),
        })
    }

    /// The summed gradient of `var` as host values, if any reached it and it is on the host.
    pub fn get(&self, var: &Var) -> Option<&[f32]> {
        match self.sums.get(&var.as_tensor().id())? {
            Sum::Host(values) => Some(values),
            Sum::Device(_) => None,
        }
    }

    /// The summed gradient of `var` as a tensor (a copy, on the CPU), if any reached it.
    pub fn tensor(&self, var: &Var) -> Result<Option<Tensor>> {
        self.sum(var).map(|sum| sum.to_tensor(var.shape(), &candle_core::Device::Cpu)).transpose()
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
        // The transports sum host buffers (NCCL copies them to its GPU and back).
        for var in vars {
            self.bring_to_host(var)?;
        }
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
                    Some(Sum::Host(sum)) => sum.copy_from_slice(part),
                    _ => {
                        self.sums.insert(var.as_tensor().id(), Sum::Host(part.to_vec()));
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
    cores().min(len / PER_THREAD).max(1)
}

/// The cores this process may use, read once: `available_parallelism` reads the cgroup's CPU
/// quota files and the affinity mask on every call, and the update asked it for every tensor
/// of every step (~90 reads a second in a running job).
pub(crate) fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
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

    /// Two variables, and `grads` after three backward passes of `k·Σa + Σb²` (k = 1, 2, 3):
    /// a's gradient sums to 6 each, b's to 6·b.
    fn three_passes(mut grads: Gradients) -> (Var, Var, Gradients) {
        let a = Var::new(&[1.0f32, 2.0, 3.0], &Device::Cpu).unwrap();
        let b = Var::new(&[[1.0f32, -1.0], [0.5, 2.0]], &Device::Cpu).unwrap();
        for k in 1..=3 {
            let loss = ((a.as_tensor() * k as f64).unwrap().sum_all().unwrap()
                + b.as_tensor().sqr().unwrap().sum_all().unwrap())
            .unwrap();
            let mut store = loss.backward().unwrap();
            assert_eq!(grads.absorb(&mut store, [&a, &b]).unwrap(), 2);
            assert!(store.get(a.as_tensor()).is_none() && store.get(b.as_tensor()).is_none());
        }
        (a, b, grads)
    }

    #[test]
    fn sums_in_place_what_backward_passes_return() {
        let (a, b, grads) = three_passes(Gradients::new());
        assert_eq!(grads.get(&a).unwrap(), [6.0, 6.0, 6.0]);
        assert_eq!(grads.get(&b).unwrap(), [6.0, -6.0, 3.0, 12.0]);
        assert_eq!(grads.tensor(&b).unwrap().unwrap().dims(), [2, 2]);
    }

    /// Sums kept as tensors (a GPU's) add up to the same, report where they are, and come
    /// to the host for a product that writes into the sum or for a collective.
    #[test]
    fn sums_kept_as_tensors_equal_the_host_sums() {
        let (a, b, mut grads) = three_passes(Gradients::as_tensors());
        assert!(grads.get(&a).is_none(), "a tensor sum has no host values to lend");
        let Some(GradSum::Device(sum)) = grads.sum(&b) else { panic!("b's sum is a tensor") };
        assert_eq!(sum.to_vec2::<f32>().unwrap(), [[6.0, -6.0], [3.0, 12.0]]);
        assert_eq!(grads.sum(&b).unwrap().sum_of_squares().unwrap(), 36.0 + 36.0 + 9.0 + 144.0);
        assert_eq!(grads.tensor(&a).unwrap().unwrap().to_vec1::<f32>().unwrap(), [6.0, 6.0, 6.0]);
        // A product writing into a's sum gets it on the host, then the sum stays there.
        grads.add_with(&a, |sum| sum[0] += 1.0).unwrap();
        assert_eq!(grads.get(&a).unwrap(), [7.0, 6.0, 6.0]);
        // A wrong shape is refused, not broadcast.
        let wrong = Tensor::new(&[1.0f32, 2.0], &Device::Cpu).unwrap();
        assert!(grads.add(&b, wrong).is_err());
        // One rank's collective is the identity, and leaves every sum on the host.
        let one = wirl_model::comm::Solo;
        grads.all_reduce(&[&a, &b], &one, &[]).unwrap();
        assert_eq!(grads.get(&b).unwrap(), [6.0, -6.0, 3.0, 12.0]);
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
