//! Objects a check makes, released whatever way it ends.

use super::*;

/// Tracks what a check made and releases, in dependency order, whatever is
/// left when it ends: gates are opened first (so no stream waits forever),
/// then fences, streams, mappings, physical-object references,
/// reservations and allocations.
pub(crate) struct Scope<'a> {
    pub m: &'a Mech,
    pub log: &'a Log,
    allocs: Vec<MemplugObjectRef>,
    reservations: Vec<MemplugObjectRef>,
    objects: Vec<MemplugObjectRef>,
    mappings: Vec<(MemplugObjectRef, u64, u64)>,
    streams: Vec<u64>,
    fences: Vec<u64>,
    gates: Vec<Arc<Gate>>,
}

impl<'a> Scope<'a> {
    pub(crate) fn new(ctx: &'a Ctx, m: &'a Mech) -> Self {
        Scope {
            m,
            log: &ctx.log,
            allocs: Vec::new(),
            reservations: Vec::new(),
            objects: Vec::new(),
            mappings: Vec::new(),
            streams: Vec::new(),
            fences: Vec::new(),
            gates: Vec::new(),
        }
    }

    fn forget(list: &mut Vec<MemplugObjectRef>, o: &MemplugObjectRef) {
        if let Some(i) = list.iter().position(|x| x == o) {
            list.swap_remove(i);
        }
    }

    /// Allocates; a success is tracked.
    pub(crate) fn allocate(&mut self, req: &MemplugRequest) -> Made {
        let made = self.m.allocate(self.log, req);
        if made.status == MEMPLUG_STATUS_OK {
            self.allocs.push(made.obj);
        }
        made
    }

    /// Allocates `size` bytes aligned to `align`, or fails the check.
    pub(crate) fn alloc_ok(&mut self, size: u64, align: u64) -> Result<MemplugObjectRef, Verdict> {
        let req = crate::raw::request(self.m, size, align);
        let made = self.allocate(&req);
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("allocate({size}, align {align})"))?;
        ensure!(
            made.block.addr != 0 && made.block.size >= size,
            "allocate({size}, align {align}) returned OK with address {:#x} and size {}",
            made.block.addr,
            made.block.size
        );
        Ok(made.obj)
    }

    pub(crate) fn free(&mut self, o: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.deallocate(self.log, o);
        if s == MEMPLUG_STATUS_OK {
            Self::forget(&mut self.allocs, o);
        }
        s
    }

    /// Reserves `size` bytes, or fails the check.
    pub(crate) fn reserve_ok(&mut self, size: u64) -> Result<MemplugObjectRef, Verdict> {
        let made = self.m.reserve(self.log, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.reservations.push(made.obj);
        }
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("reserve({size})"))?;
        ensure!(
            made.block.addr != 0 && made.block.size >= size,
            "reserve({size}) returned OK with address {:#x} and size {}",
            made.block.addr,
            made.block.size
        );
        Ok(made.obj)
    }

    /// Reserves and tracks whatever the plugin says (for checks of the
    /// answer itself).
    pub(crate) fn reserve(&mut self, size: u64) -> Made {
        let made = self.m.reserve(self.log, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.reservations.push(made.obj);
        }
        made
    }

    /// Reserves with the request as given (ABI 1.2 fields); a success is
    /// tracked.
    pub(crate) fn reserve_req(&mut self, req: &MemplugRequest) -> Made {
        let made = self.m.reserve_req(self.log, req);
        if made.status == MEMPLUG_STATUS_OK {
            self.reservations.push(made.obj);
        }
        made
    }

    pub(crate) fn release_reservation(&mut self, r: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.release_reservation(self.log, r);
        if s == MEMPLUG_STATUS_OK {
            Self::forget(&mut self.reservations, r);
            self.mappings.retain(|(res, _, _)| res != r);
        }
        s
    }

    pub(crate) fn create(&mut self, size: u64) -> Made {
        let made = self.m.create(self.log, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.objects.push(made.obj);
        }
        made
    }

    /// Creates with the request as given (ABI 1.2 fields); a success is
    /// tracked.
    pub(crate) fn create_req(&mut self, req: &MemplugRequest) -> Made {
        let made = self.m.create_req(self.log, req);
        if made.status == MEMPLUG_STATUS_OK {
            self.objects.push(made.obj);
        }
        made
    }

    /// Imports a typed handle (ABI 1.2); a success is tracked.
    pub(crate) fn import_handle(&mut self, h: &MemplugHandle, req: &MemplugRequest) -> Made {
        let made = self.m.import_handle(self.log, h, req);
        if made.status == MEMPLUG_STATUS_OK {
            self.objects.push(made.obj);
        }
        made
    }

    pub(crate) fn create_ok(&mut self, size: u64) -> Result<MemplugObjectRef, Verdict> {
        let made = self.create(size);
        expect(made.status, &[MEMPLUG_STATUS_OK], &format!("create({size})"))?;
        ensure!(made.block.size >= size, "create({size}) returned OK with size {}", made.block.size);
        Ok(made.obj)
    }

    /// Imports `size` bytes from `fd` (ABI 1.1); a success is tracked.
    pub(crate) fn import(&mut self, fd: i32, size: u64) -> Made {
        let made = self.m.import_fd(self.log, fd, size);
        if made.status == MEMPLUG_STATUS_OK {
            self.objects.push(made.obj);
        }
        made
    }

    pub(crate) fn retain(&mut self, o: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.retain(self.log, o);
        if s == MEMPLUG_STATUS_OK {
            self.objects.push(*o);
        }
        s
    }

    pub(crate) fn release_object(&mut self, o: &MemplugObjectRef) -> MemplugStatus {
        let s = self.m.release_object(self.log, o);
        if s == MEMPLUG_STATUS_OK {
            Self::forget(&mut self.objects, o);
        }
        s
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn map(
        &mut self,
        o: &MemplugObjectRef,
        object_offset: u64,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        access: u32,
    ) -> MemplugStatus {
        let s = self.m.map(self.log, o, object_offset, r, offset, len, access);
        if s == MEMPLUG_STATUS_OK {
            self.mappings.push((*r, offset, len));
        }
        s
    }

    pub(crate) fn unmap(&mut self, r: &MemplugObjectRef, offset: u64, len: u64) -> MemplugStatus {
        let s = self.m.unmap(self.log, r, offset, len);
        if s == MEMPLUG_STATUS_OK {
            if let Some(i) = self.mappings.iter().position(|x| *x == (*r, offset, len)) {
                self.mappings.swap_remove(i);
            }
        }
        s
    }

    pub(crate) fn stream_ok(&mut self) -> Result<u64, Verdict> {
        let (s, h) = self.m.stream_create(self.log);
        expect(s, &[MEMPLUG_STATUS_OK], "stream_create")?;
        ensure!(h != 0, "stream_create returned OK with the handle 0");
        self.streams.push(h);
        Ok(h)
    }

    pub(crate) fn stream_destroy(&mut self, h: u64) -> MemplugStatus {
        let s = self.m.stream_destroy(self.log, h);
        if s == MEMPLUG_STATUS_OK {
            self.streams.retain(|&x| x != h);
        }
        s
    }

    pub(crate) fn fence_ok(&mut self, stream: u64) -> Result<u64, Verdict> {
        let (s, h) = self.m.fence_record(self.log, stream);
        expect(s, &[MEMPLUG_STATUS_OK], "fence_record")?;
        ensure!(h != 0, "fence_record returned OK with the handle 0");
        self.fences.push(h);
        Ok(h)
    }

    pub(crate) fn fence_destroy(&mut self, h: u64) -> MemplugStatus {
        let s = self.m.fence_destroy(self.log, h);
        if s == MEMPLUG_STATUS_OK {
            self.fences.retain(|&x| x != h);
        }
        s
    }

    /// Enqueues `job` on `stream`, or fails the check.
    pub(crate) fn enqueue_ok(&mut self, stream: u64, job: Job) -> Result<(), Verdict> {
        if let Job::Gate(g) = &job {
            self.gates.push(g.clone());
        }
        let s = enqueue_job(self.m, self.log, stream, job);
        expect(s, &[MEMPLUG_STATUS_OK], "enqueue_host_fn")
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        for g in self.gates.drain(..) {
            g.open();
        }
        for f in std::mem::take(&mut self.fences) {
            self.m.fence_destroy(self.log, f);
        }
        for s in std::mem::take(&mut self.streams) {
            self.m.stream_destroy(self.log, s);
        }
        for (r, off, len) in std::mem::take(&mut self.mappings) {
            self.m.unmap(self.log, &r, off, len);
        }
        for o in std::mem::take(&mut self.objects) {
            self.m.release_object(self.log, &o);
        }
        for r in std::mem::take(&mut self.reservations) {
            self.m.release_reservation(self.log, &r);
        }
        for a in std::mem::take(&mut self.allocs) {
            self.m.deallocate(self.log, &a);
        }
    }
}
