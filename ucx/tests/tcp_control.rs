//! The control stream over TCP (as between nodes), two peers in one
//! process on two threads, each with its own UCX context; raw transfers.

mod common;

use common::*;
use memplug_ucx::{Access, Peer};
use std::net::{TcpListener, TcpStream};

const MIB: u64 = 1 << 20;

#[test]
fn peers_over_a_tcp_control_stream_move_raw_memory() {
    let Some(()) = ucx_or_skip("peers_over_a_tcp_control_stream_move_raw_memory") else { return };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    let owner = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let ucx = ucx(TCP);
        let mut peer = Peer::connect(&ucx, stream, TIMEOUT).unwrap();
        let m = memory(16 * MIB);
        let mut region = m.kv.reserve_virtual(16 * MIB).unwrap();
        region.grow_to(MIB, |_| Ok::<(), String>(())).unwrap();
        // SAFETY: committed CPU memory of the region.
        unsafe { fill(region.addr(), MIB, 3) };
        let reg = ucx.register_region(&m.context, &mut region, 0, MIB, Access::ReadWrite).unwrap();
        peer.offer(&reg, 9).unwrap();
        peer.serve(TIMEOUT).unwrap();
        // The other side wrote 4 KiB of 0x77 at +64 KiB before it left.
        // SAFETY: as above.
        let s = unsafe { std::slice::from_raw_parts((region.addr() + (64 << 10)) as *const u8, 4096) };
        assert!(s.iter().all(|&b| b == 0x77));
        assert_eq!(reg.holders(), 0);
        reg.deregister().map_err(|(_, e)| e).unwrap();
    });
    let ucx = ucx(TCP);
    let mut peer = Peer::connect(&ucx, TcpStream::connect(at).unwrap(), TIMEOUT).unwrap();
    let r = peer.next_offer(TIMEOUT).unwrap();
    assert_eq!((r.len, r.tag, r.writable), (MIB, 9, true));
    let mut buf = vec![0u8; MIB as usize];
    // SAFETY: `buf` outlives the transfer (waited for below).
    let t = unsafe { peer.get_raw(&r, 0, buf.as_mut_ptr() as u64, MIB) }.unwrap();
    t.wait(TIMEOUT).unwrap();
    // SAFETY: `buf` is readable.
    assert!(unsafe { holds(buf.as_ptr() as u64, MIB, 3, 0) });
    let out = vec![0x77u8; 4096];
    // SAFETY: `out` outlives the transfer (waited for below).
    let t = unsafe { peer.put_raw(&r, 64 << 10, out.as_ptr() as u64, 4096) }.unwrap();
    t.wait(TIMEOUT).unwrap();
    peer.release(&r, TIMEOUT).unwrap();
    drop(peer);
    owner.join().unwrap();
}
