//! The HTTP/1.1 client every scenario drives, and the modern request shapes.

use crate::*;

/// One keep-alive HTTP/1.1 connection.
pub(crate) struct Conn {
    pub(crate) tx: SendRequest<Full<Bytes>>,
    pub(crate) host: HeaderValue,
}

pub(crate) type Headers = Vec<(HeaderName, HeaderValue)>;

impl Conn {
    pub(crate) async fn open(addr: SocketAddr) -> Res<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let tls = TLS_TARGETS
            .lock()
            .ok()
            .and_then(|t| t.iter().find(|(a, _)| *a == addr).map(|(_, c)| c.clone()));
        let tx = match tls {
            None => {
                let (tx, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                tx
            }
            Some(config) => {
                let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                let stream = tokio_rustls::TlsConnector::from(config)
                    .connect(name, stream)
                    .await?;
                let (tx, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                tx
            }
        };
        Ok(Self {
            tx,
            host: HeaderValue::from_str(&addr.to_string())?,
        })
    }

    pub(crate) async fn post(
        &mut self,
        headers: &Headers,
        body: Bytes,
    ) -> Res<http::Response<Incoming>> {
        self.tx.ready().await?;
        let mut req = Request::post("/mcp").body(Full::new(body))?;
        let h = req.headers_mut();
        h.insert(header::HOST, self.host.clone());
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        for (k, v) in headers {
            h.insert(k.clone(), v.clone());
        }
        Ok(self.tx.send_request(req).await?)
    }

    /// POSTs and returns every JSON-RPC message of the answer (JSON or SSE).
    pub(crate) async fn exchange(
        &mut self,
        headers: &Headers,
        body: Bytes,
    ) -> Res<(StatusCode, Vec<Value>)> {
        let resp = self.post(headers, body).await?;
        let status = resp.status();
        let is_sse = is_sse(&resp);
        let bytes = resp.into_body().collect().await?.to_bytes();
        if !is_sse {
            if bytes.is_empty() {
                return Ok((status, Vec::new()));
            }
            return Ok((status, vec![serde_json::from_slice(&bytes)?]));
        }
        let mut dec = sse::Decoder::new(16 << 20);
        let mut out = Vec::new();
        for ev in dec.feed(&bytes)? {
            if !ev.data.trim().is_empty() {
                out.push(serde_json::from_str(&ev.data)?);
            }
        }
        Ok((status, out))
    }
}

pub(crate) fn is_sse(resp: &http::Response<Incoming>) -> bool {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

pub(crate) fn hv(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

pub(crate) fn modern_headers(method: &str, name: Option<&str>) -> Headers {
    let mut h = vec![
        (HeaderName::from_static("mcp-protocol-version"), hv(MODERN)),
        (HeaderName::from_static("mcp-method"), hv(method)),
    ];
    if let Some(n) = name {
        h.push((HeaderName::from_static("mcp-name"), hv(n)));
    }
    h
}

pub(crate) fn modern_body(id: u64, method: &str, mut params: Value, caps: Value) -> Bytes {
    params["_meta"] =
        json!({PV: MODERN, CAPS: caps, CLIENT_INFO: {"name": "dualera-bench", "version": "0"}});
    Bytes::from(
        serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .unwrap_or_default(),
    )
}

/// The JSON-RPC response among `msgs`: its result, or an error.
pub(crate) fn result_of(status: StatusCode, msgs: &[Value]) -> Res<Value> {
    let r = msgs
        .iter()
        .rev()
        .find(|m| m.get("result").is_some() || m.get("error").is_some())
        .ok_or_else(|| format!("HTTP {status} without a JSON-RPC response"))?;
    if let Some(e) = r.get("error") {
        return Err(format!("JSON-RPC error: {e}").into());
    }
    Ok(r["result"].clone())
}
