//! The halves: each registered for its own readiness, and what that spares the runtime's
//! `epoll_wait` after a read made behind its back (a look after a SEND).

use std::os::fd::AsRawFd;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ours, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (ours.unwrap(), theirs.unwrap().0)
}

/// An epoll instance of the test's own, edge-triggered like the runtime's, watching `fd` for
/// `events`; returns how many events a wait that does not block reports.
struct Epoll(i32);

impl Epoll {
    fn watching(fd: i32, events: u32) -> Epoll {
        // SAFETY: plain system calls on descriptors the test owns; the event is a local value.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            assert!(ep >= 0);
            let mut ev = libc::epoll_event { events: events | libc::EPOLLET as u32, u64: 1 };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev), 0);
            Epoll(ep)
        }
    }

    fn ready_now(&self) -> i32 {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: `evs` has room for the 4 events asked for.
        unsafe { libc::epoll_wait(self.0, evs.as_mut_ptr(), 4, 0) }
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Bytes that arrive queue a registration that asked for readable; read behind its back, it
/// is then not reported if it asked for readable alone, and reported (the socket is writable)
/// if it asked for writable too: the wait that would return at once for nothing.
#[tokio::test(flavor = "current_thread")]
async fn an_edge_read_behind_a_readable_only_registration_is_not_reported() {
    let (ours, mut theirs) = pair().await;
    let (read, _write) = split(ours).unwrap();
    let fd = read.fd.get_ref().as_raw_fd();
    let readable = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
    let alone = Epoll::watching(fd, readable);
    let both = Epoll::watching(fd, readable | libc::EPOLLOUT as u32);
    assert_eq!(both.ready_now(), 1, "a fresh registration reports the writable socket");
    assert_eq!((alone.ready_now(), both.ready_now()), (0, 0));

    theirs.write_all(b"the answer").await.unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(read.read_now(&mut buf).unwrap(), 10);
    assert_eq!(alone.ready_now(), 0, "a readable-only registration reported a drained edge");
    assert_eq!(both.ready_now(), 1, "the kernel no longer reports a drained edge as writable");
}

/// The halves read and write the one socket; dropping the writing half ends the peer's stream
/// (as tokio's write half does), and the reading half still reads.
#[tokio::test(flavor = "current_thread")]
async fn the_halves_read_and_write_and_the_write_half_ends_the_stream_when_dropped() {
    let (ours, mut theirs) = pair().await;
    let (mut read, write) = split(ours).unwrap();
    assert_eq!(write.try_write(b"ping").unwrap(), 4);
    let mut got = [0u8; 4];
    theirs.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");

    drop(write);
    let mut rest = Vec::new();
    theirs.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());

    theirs.write_all(b"pong").await.unwrap();
    let mut buf = [0u8; 16];
    let n = read.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"pong");
}
