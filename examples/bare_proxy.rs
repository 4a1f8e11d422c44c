//! The physical-limit baseline for the gateway's modern pass-through: the least a hyper
//! reverse proxy can do. Every request on any path is sent to the upstream endpoint
//! with its headers and streamed body untouched (only the URI and `Host` change), over
//! one pooled client; the upstream response streams back untouched. No era routing, no
//! Origin/Host guard, no hop-by-hop stripping, no body limit, no logging.
//!
//! ```sh
//! cargo run --release --example bare_proxy -- http://127.0.0.1:8787/mcp [127.0.0.1:0]
//! cargo run --release --example bare_proxy -- https://127.0.0.1:8787/mcp 127.0.0.1:0 ca.pem
//! ```
//!
//! An `https://` upstream is reached with rustls (ring) trusting the given CA file,
//! HTTP/2 when the upstream offers it by ALPN, as the gateway does.
//!
//! Prints `bare_proxy listening on http://ADDR/mcp` on stderr once bound (the benchmark
//! waits for that line). Loopback only. Stops on Ctrl-C / SIGTERM or when stdin closes.

use http::header::{HeaderValue, HOST};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(upstream) = args.first() else {
        eprintln!("usage: bare_proxy <upstream-url> [listen-addr]");
        std::process::exit(2);
    };
    let upstream: Uri = upstream.parse()?;
    let listen: SocketAddr = args.get(1).map_or("127.0.0.1:0", String::as_str).parse()?;
    if !listen.ip().is_loopback() {
        return Err("bare_proxy listens on loopback only".into());
    }
    let host = HeaderValue::from_str(upstream.authority().ok_or("upstream has no host")?.as_str())?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.enforce_http(false);
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = args.get(2) {
        use rustls::pki_types::pem::PemObject;
        for c in rustls::pki_types::CertificateDer::pem_file_iter(ca)? {
            roots.add(c?)?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(dualera::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(connector);
    let client: Client<HttpsConnector<HttpConnector>, Incoming> =
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .build(connector);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!(
        "bare_proxy listening on http://{}/mcp",
        listener.local_addr()?
    );
    let stop = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    tokio::pin!(stop);
    loop {
        let (stream, _) = tokio::select! {
            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
            () = &mut stop => return Ok(()),
        };
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        let upstream = upstream.clone();
        let host = host.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |mut req: Request<Incoming>| {
                let client = client.clone();
                *req.uri_mut() = upstream.clone();
                *req.version_mut() = http::Version::HTTP_11;
                req.headers_mut().insert(HOST, host.clone());
                async move {
                    Ok::<_, Infallible>(match client.request(req).await {
                        Ok(mut resp) => {
                            *resp.version_mut() = http::Version::HTTP_11;
                            resp.map(http_body_util::Either::Left)
                        }
                        Err(_) => {
                            let mut r = Response::new(http_body_util::Either::Right(
                                http_body_util::Empty::new(),
                            ));
                            *r.status_mut() = http::StatusCode::BAD_GATEWAY;
                            r
                        }
                    })
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
