//! The entries waiting on one fence, the first kept inline: most fences
//! guard one free (an allocation's, a shrink's), and a vector would cost
//! a heap allocation and its free per enqueue (ARCHITECTURE.md §6: the
//! small poll case).

/// A list that keeps its first element inline. Order is push order.
pub(super) struct Entries<T> {
    first: Option<T>,
    more: Vec<T>,
}

impl<T> Entries<T> {
    /// A list of one.
    #[inline]
    pub(super) fn one(e: T) -> Self {
        Entries { first: Some(e), more: Vec::new() }
    }

    #[inline]
    pub(super) fn push(&mut self, e: T) {
        if self.first.is_none() && self.more.is_empty() {
            self.first = Some(e);
        } else {
            self.more.push(e);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none() && self.more.is_empty()
    }

    pub(super) fn first(&self) -> Option<&T> {
        self.iter().next()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(self.more.iter())
    }

    /// Takes out the elements `pred` selects, keeping the others in order.
    pub(super) fn take_where(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let all = std::mem::replace(self, Entries { first: None, more: Vec::new() });
        let mut out = Vec::new();
        for e in all {
            if pred(&e) {
                out.push(e);
            } else {
                self.push(e);
            }
        }
        out
    }
}

impl<T> IntoIterator for Entries<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;
    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.more)
    }
}

#[cfg(test)]
mod tests {
    use super::Entries;

    #[test]
    fn keeps_push_order_through_a_partition() {
        let mut e = Entries::one(1);
        for i in 2..=5 {
            e.push(i);
        }
        assert_eq!(e.iter().copied().collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        let odd = e.take_where(|i| i % 2 == 1);
        assert_eq!(odd, [1, 3, 5]);
        assert_eq!(e.iter().copied().collect::<Vec<_>>(), [2, 4]);
        assert_eq!(e.first(), Some(&2));
        let rest = e.take_where(|_| true);
        assert_eq!(rest, [2, 4]);
        assert!(e.is_empty() && e.first().is_none());
        e.push(9);
        assert_eq!(e.into_iter().collect::<Vec<_>>(), [9]);
    }
}
