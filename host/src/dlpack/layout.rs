//! The caller's description of a tensor over exported memory (shape, dtype,
//! strides, offset), and the check that it stays inside that memory.

use super::abi::DLDataType;
use super::ExportError;

/// How the exported bytes are to be seen: the caller's choice, checked
/// against the memory's length (a layout reaching past it is refused).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    /// Extents, outermost first; none negative.
    pub shape: Vec<i64>,
    /// Element type. Whole bytes only: `bits * lanes` a multiple of 8.
    pub dtype: DLDataType,
    /// Strides in elements, one per dimension; `None` is row-major
    /// (C-contiguous).
    pub strides: Option<Vec<i64>>,
    /// Bytes from the memory's first byte to the tensor's first element.
    pub byte_offset: u64,
}

impl TensorLayout {
    /// A row-major tensor of `shape` and `dtype` at the memory's start.
    pub fn new(shape: impl Into<Vec<i64>>, dtype: DLDataType) -> Self {
        TensorLayout { shape: shape.into(), dtype, strides: None, byte_offset: 0 }
    }

    /// One dimension of `len` bytes (`uint8`): the whole of an allocation.
    pub fn bytes(len: u64) -> Self {
        let len = i64::try_from(len).unwrap_or(i64::MAX);
        TensorLayout::new(vec![len], DLDataType { code: super::abi::K_DL_UINT, bits: 8, lanes: 1 })
    }

    /// Starting `bytes` into the memory.
    pub fn at(mut self, bytes: u64) -> Self {
        self.byte_offset = bytes;
        self
    }

    /// Bytes per element.
    pub fn itemsize(&self) -> u64 {
        u64::from(self.dtype.bits) * u64::from(self.dtype.lanes) / 8
    }

    /// The strides to publish (the caller's, or row-major) and the byte
    /// range `[start, end)` of the memory the tensor touches (empty for a
    /// tensor of no elements), or why the layout is refused.
    pub(crate) fn check(&self, len: u64) -> Result<Checked, ExportError> {
        let bad = |why: String| Err(ExportError::Layout(why));
        let d = self.dtype;
        if d.bits == 0 || d.lanes == 0 {
            return bad(format!("dtype {d:?} has no bits or no lanes"));
        }
        if (u32::from(d.bits) * u32::from(d.lanes)) % 8 != 0 {
            return bad(format!(
                "dtype {d:?} is not a whole number of bytes (sub-byte types are not exported)"
            ));
        }
        if i32::try_from(self.shape.len()).is_err() {
            return bad(format!("{} dimensions", self.shape.len()));
        }
        if let Some(e) = self.shape.iter().find(|&&e| e < 0) {
            return bad(format!("negative extent {e} in shape {:?}", self.shape));
        }
        let strides = match &self.strides {
            Some(s) if s.len() != self.shape.len() => {
                return bad(format!("{} strides for {} dimensions", s.len(), self.shape.len()))
            }
            Some(s) => s.clone(),
            None => row_major(&self.shape),
        };
        let item = i128::from(self.itemsize() as u32);
        let offset = i128::from(self.byte_offset);
        let empty = self.shape.contains(&0);
        // The byte range reached, exactly; `None` past what i128 holds
        // (so far past any memory).
        let range = || -> Option<(i128, i128)> {
            if empty {
                return Some((offset, offset));
            }
            let (mut lo, mut hi) = (0i128, 0i128);
            for (&e, &s) in self.shape.iter().zip(&strides) {
                let reach = i128::from(e - 1).checked_mul(i128::from(s))?;
                if reach < 0 {
                    lo = lo.checked_add(reach)?;
                } else {
                    hi = hi.checked_add(reach)?;
                }
            }
            Some((
                offset.checked_add(lo.checked_mul(item)?)?,
                offset.checked_add(hi.checked_add(1)?.checked_mul(item)?)?,
            ))
        };
        let Some((start, end)) = range() else {
            return Err(ExportError::OutOfBounds { needed: u64::MAX, available: len });
        };
        if start < 0 {
            return bad(format!("strides {strides:?} reach {} B before the memory's start", -start));
        }
        if end > i128::from(len) {
            return Err(ExportError::OutOfBounds { needed: end.min(u64::MAX.into()) as u64, available: len });
        }
        Ok(Checked { strides, start: start as u64, end: end as u64, first: self.byte_offset, empty })
    }
}

/// A layout that fits: what the tensor publishes and what it touches.
pub(crate) struct Checked {
    pub(crate) strides: Vec<i64>,
    /// First byte touched, from the memory's start.
    pub(crate) start: u64,
    /// One past the last byte touched.
    pub(crate) end: u64,
    /// The first element's byte, from the memory's start: where DLPack's
    /// `data` points. Past `start` when a stride is negative.
    pub(crate) first: u64,
    /// No elements (the data pointer is then NULL).
    pub(crate) empty: bool,
}

/// Row-major strides (in elements) of `shape`; saturating, since a shape
/// whose product overflows is refused by the bounds check anyway.
fn row_major(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlpack::abi::K_DL_FLOAT;

    const F32: DLDataType = DLDataType { code: K_DL_FLOAT, bits: 32, lanes: 1 };

    #[test]
    fn row_major_fits_exactly() {
        let c = TensorLayout::new([2, 3, 4], F32).check(96).unwrap();
        assert_eq!((c.strides, c.start), (vec![12, 4, 1], 0));
        assert!(matches!(
            TensorLayout::new([2, 3, 4], F32).check(95),
            Err(ExportError::OutOfBounds { needed: 96, available: 95 })
        ));
    }

    #[test]
    fn offsets_and_strides_are_bounded() {
        assert_eq!(TensorLayout::new([4], F32).at(16).check(32).unwrap().start, 16);
        assert!(TensorLayout::new([4], F32).at(17).check(32).is_err());
        // A transposed view of a 3x2 matrix stays inside it.
        let t = TensorLayout { strides: Some(vec![1, 2]), ..TensorLayout::new([2, 3], F32) };
        assert!(t.check(24).is_ok());
        assert!(matches!(t.check(23), Err(ExportError::OutOfBounds { needed: 24, .. })));
        // A negative stride from offset 0 reaches before the start.
        let n = TensorLayout { strides: Some(vec![-1]), ..TensorLayout::new([2], F32) };
        assert!(matches!(n.check(64), Err(ExportError::Layout(_))));
        let c = n.at(4).check(8).unwrap();
        assert_eq!((c.start, c.first), (0, 4), "element 0 at byte 4, element 1 at byte 0");
    }

    #[test]
    fn bad_layouts_are_refused() {
        let sub = DLDataType { code: K_DL_FLOAT, bits: 4, lanes: 1 };
        assert!(TensorLayout::new([2], sub).check(8).is_err());
        assert!(TensorLayout::new([-1], F32).check(8).is_err());
        let wrong = TensorLayout { strides: Some(vec![1]), ..TensorLayout::new([2, 2], F32) };
        assert!(wrong.check(64).is_err());
        // An overflowing shape is out of bounds, not a wrapped small size.
        assert!(TensorLayout::new([i64::MAX, i64::MAX], F32).check(u64::MAX).is_err());
    }

    #[test]
    fn empty_tensor_touches_nothing() {
        let c = TensorLayout::new([0, 5], F32).check(0).unwrap();
        assert!(c.empty);
        assert_eq!(c.start, 0);
    }
}
