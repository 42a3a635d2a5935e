//! TLS terminated by the server itself (`osprey serve --tls-cert --tls-key`): a client that
//! trusts the certificate gets its answers over TLS; a client speaking plain HTTP to the TLS
//! port gets no answer and costs the server nothing; unusable certificates and keys are
//! refused, naming the file.

use std::sync::Arc;

use osprey_gateway::{HttpConfig, Services};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A self-signed certificate for `localhost`, written as PEM files in a temporary directory.
struct Certificate {
    dir: tempfile::TempDir,
    der: rustls::pki_types::CertificateDer<'static>,
}

impl Certificate {
    fn new() -> Self {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cert.pem"), made.cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), made.signing_key.serialize_pem()).unwrap();
        Self {
            dir,
            der: made.cert.der().clone(),
        }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }
}

/// Serves the API over TLS on a free port; its address.
async fn serve_tls(cert: &Certificate) -> std::net::SocketAddr {
    let tls = osprey_gateway::tls::server_config(&cert.path("cert.pem"), &cert.path("key.pem"))
        .expect("a fresh certificate and its key are usable");
    let config = HttpConfig {
        tls: Some(tls),
        ..HttpConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Services::serving("smollm2-135m-instruct");
    tokio::spawn(async move {
        osprey_gateway::serve(listener, state, &config, std::future::pending()).await
    });
    addr
}

/// `GET path` over TLS, trusting only `cert`; the whole response.
async fn get_over_tls(addr: std::net::SocketAddr, cert: &Certificate, path: &str) -> String {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.expect("the handshake");
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    // A server may close without TLS's close_notify once the response is sent; what was
    // read by then is the response.
    let _ = tls.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn the_api_is_served_over_tls() {
    let cert = Certificate::new();
    let addr = serve_tls(&cert).await;

    let health = get_over_tls(addr, &cert, "/health").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let missing = get_over_tls(addr, &cert, "/v1/nothing-here").await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    assert!(
        missing.contains(r#""error""#),
        "the envelope, over TLS too: {missing}"
    );

    // Plain HTTP to the TLS port: no HTTP answer, the connection closed.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer).await;
    assert!(!answer.starts_with(b"HTTP/"), "{answer:?}");

    // And the server goes on.
    let again = get_over_tls(addr, &cert, "/health").await;
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
}

#[test]
fn unusable_certificates_and_keys_are_refused_naming_the_file() {
    let (one, other) = (Certificate::new(), Certificate::new());
    let config = osprey_gateway::tls::server_config;

    // Another certificate's key.
    let e = config(&one.path("cert.pem"), &other.path("key.pem")).unwrap_err();
    assert!(e.to_string().contains("cannot be used together"), "{e}");
    // Files that are not PEM, or hold the wrong thing.
    std::fs::write(one.path("junk.pem"), "not a certificate").unwrap();
    for (cert, key, named) in [
        ("junk.pem", "key.pem", "junk.pem"),
        ("cert.pem", "junk.pem", "junk.pem"),
        ("cert.pem", "cert.pem", "cert.pem"),
        ("missing.pem", "key.pem", "missing.pem"),
    ] {
        let e = config(&one.path(cert), &one.path(key)).unwrap_err();
        assert!(e.to_string().contains(named), "{cert} + {key}: {e}");
    }
}
