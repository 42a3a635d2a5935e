//! The README's first command, as a user runs it: `osprey serve` fetches (or finds) the default
//! model and serves it; the official `openai` Python client then exercises the API.

use std::process::{Child, Command, Stdio};

use crate::support::{STARTUP, ServerSlot};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_ready(port: u16, server: &mut Server) {
    osprey_testkit::eventually_blocking(
        || {
            if let Ok(Some(status)) = server.0.try_wait() {
                panic!("osprey serve exited early with {status}");
            }
            let ready = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut s| {
                use std::io::{Read, Write};
                let _ = s.write_all(b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let mut buf = String::new();
                let _ = s.read_to_string(&mut buf);
                buf.starts_with("HTTP/1.1 200")
            });
            ready.then_some(())
        },
        STARTUP,
    );
}

#[test]
fn the_openai_python_client_works_against_osprey_serve() {
    let _slot = ServerSlot::take();
    let python = osprey_testkit::openai_python();
    osprey_testkit::default_model(); // fetched once, shared with the other tests
    let port = osprey_testkit::free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_osprey"))
        .args([
            "serve",
            "--port",
            &port.to_string(),
            "--kv-cache-memory",
            "256MiB",
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("starting osprey serve");
    let mut server = Server(child);
    wait_ready(port, &mut server);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/openai_client_check.py"
    );
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}/v1"))
        .output()
        .expect("running the openai client script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the openai client checks failed:\n{stdout}"
    );
    assert!(stdout.contains("all checks passed"));
}
