//! The 2025-11-25 Streamable HTTP client the legacy scenarios drive.

use crate::*;

pub(crate) fn legacy_headers(session: &str) -> Headers {
    vec![
        (HeaderName::from_static("mcp-session-id"), hv(session)),
        (HeaderName::from_static("mcp-protocol-version"), hv(LEGACY)),
    ]
}

pub(crate) fn rpc(id: u64, method: &str, params: Value) -> Bytes {
    Bytes::from(
        serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .unwrap_or_default(),
    )
}

/// Opens an initialized legacy session on `conn`; returns its id.
pub(crate) async fn legacy_open(conn: &mut Conn) -> Res<String> {
    let init = rpc(
        0,
        "initialize",
        json!({"protocolVersion": LEGACY, "capabilities": {"elicitation": {"form": {}}},
               "clientInfo": {"name": "dualera-bench", "version": "0"}}),
    );
    let resp = conn.post(&Vec::new(), init).await?;
    let status = resp.status();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp.into_body().collect().await?.to_bytes();
    let Some(sid) = sid else {
        return Err(format!(
            "initialize: HTTP {status} without a session: {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    };
    let note = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let resp = conn.post(&legacy_headers(&sid), note).await?;
    let st = resp.status();
    resp.into_body().collect().await?;
    if st != StatusCode::ACCEPTED {
        return Err(format!("initialized: HTTP {st}").into());
    }
    Ok(sid)
}

/// The reply a scripted user gives to a delete form: accept + confirm the first note.
pub(crate) fn accept_reply(live: &Value) -> Res<Bytes> {
    let note = live
        .pointer("/params/requestedSchema/properties/note_id/enum/0")
        .cloned()
        .ok_or("elicitation without a note to pick")?;
    Ok(Bytes::from(serde_json::to_vec(&json!({
        "jsonrpc": "2.0", "id": live["id"],
        "result": {"action": "accept", "content": {"note_id": note, "confirm": true}}
    }))?))
}

/// Reads an SSE response until it ends, calling `on_live` for server requests.
pub(crate) async fn read_sse(
    resp: http::Response<Incoming>,
    mut on_live: impl FnMut(Value) -> Option<Bytes>,
    replies: &mut Vec<Bytes>,
) -> Res<Option<Value>> {
    let mut body = resp.into_body();
    let mut dec = sse::Decoder::new(16 << 20);
    let mut response = None;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        for ev in dec.feed(data)? {
            if ev.data.trim().is_empty() {
                continue;
            }
            let m: Value = serde_json::from_str(&ev.data)?;
            if m.get("method").is_some() && m.get("id").is_some() {
                if let Some(r) = on_live(m) {
                    replies.push(r);
                }
            } else if m.get("result").is_some() || m.get("error").is_some() {
                response = Some(m);
            }
        }
    }
    Ok(response)
}

/// One legacy session on two connections (requests + SSE on `a`, replies on `b`).
pub(crate) struct LegacyClient {
    pub(crate) a: Conn,
    pub(crate) b: Conn,
    pub(crate) headers: Headers,
    pub(crate) next: u64,
}

impl LegacyClient {
    pub(crate) async fn open(addr: SocketAddr) -> Res<Self> {
        let mut a = Conn::open(addr).await?;
        let b = Conn::open(addr).await?;
        let sid = legacy_open(&mut a).await?;
        Ok(Self {
            a,
            b,
            headers: legacy_headers(&sid),
            next: 1,
        })
    }

    /// A session opened on `first`, its replies posted to `second` (two replicas).
    pub(crate) async fn open_pair(first: SocketAddr, second: SocketAddr) -> Res<Self> {
        let mut a = Conn::open(first).await?;
        let b = Conn::open(second).await?;
        let sid = legacy_open(&mut a).await?;
        Ok(Self {
            a,
            b,
            headers: legacy_headers(&sid),
            next: 1,
        })
    }

    /// Swaps the two connections: the next flow's requests go where the replies went.
    pub(crate) fn swap(&mut self) {
        std::mem::swap(&mut self.a, &mut self.b);
    }

    /// Calls a tool, answering live elicitation with accept; returns the result.
    pub(crate) async fn tool(&mut self, name: &str, args: Value) -> Res<Value> {
        self.tool_metered(name, args, None).await
    }

    /// [`LegacyClient::tool`], marking each step of the flow on `meter`: the request
    /// until the elicitation arrives, the answer until its 202, the rest until the
    /// result (or the whole call when it is answered at once).
    pub(crate) async fn tool_metered(
        &mut self,
        name: &str,
        args: Value,
        meter: Option<&mut StepMeter<'_>>,
    ) -> Res<Value> {
        self.tool_answering(name, args, meter, accept_reply).await
    }

    /// [`LegacyClient::tool_metered`], each live request answered with `reply(request)`.
    pub(crate) async fn tool_answering(
        &mut self,
        name: &str,
        args: Value,
        mut meter: Option<&mut StepMeter<'_>>,
        reply: impl Fn(&Value) -> Res<Bytes>,
    ) -> Res<Value> {
        self.next += 1;
        let body = rpc(
            self.next,
            "tools/call",
            json!({"name": name, "arguments": args}),
        );
        let resp = self.a.post(&self.headers, body).await?;
        let status = resp.status();
        if !is_sse(&resp) {
            let bytes = resp.into_body().collect().await?.to_bytes();
            if let Some(m) = meter.as_deref_mut() {
                m.mark("tools/call answered at once (JSON)").await?;
            }
            return result_of(status, &[serde_json::from_slice(&bytes)?]);
        }
        // The elicitation arrives first; answer it on the other connection while this
        // stream stays open, then read on to the response.
        let mut body = resp.into_body();
        let mut dec = sse::Decoder::new(16 << 20);
        let mut response = None;
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            for ev in dec.feed(data)? {
                if ev.data.trim().is_empty() {
                    continue;
                }
                let m: Value = serde_json::from_str(&ev.data)?;
                if m.get("method").is_some() && m.get("id").is_some() {
                    if let Some(m) = meter.as_deref_mut() {
                        m.mark("tools/call until the elicitation is delivered")
                            .await?;
                    }
                    let answer = reply(&m)?;
                    let r = self.b.post(&self.headers, answer).await?;
                    let st = r.status();
                    r.into_body().collect().await?;
                    if st != StatusCode::ACCEPTED {
                        return Err(format!("reply refused: HTTP {st}").into());
                    }
                    if let Some(m) = meter.as_deref_mut() {
                        m.mark("the host's answer (POST until 202)").await?;
                    }
                } else if m.get("result").is_some() || m.get("error").is_some() {
                    response = Some(m);
                }
            }
        }
        if let Some(m) = meter {
            m.mark("the retry until the result is delivered").await?;
        }
        result_of(status, &response.into_iter().collect::<Vec<_>>())
    }
}
