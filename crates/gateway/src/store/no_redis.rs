//! The Redis session store in a build without the `redis` feature: a
//! `session_store = "redis://…"` is refused when the configuration is read
//! ([`client::check_url`]), so no value of these types ever exists; they only keep
//! the store's callers the same in both builds.

use super::{
    Created, Detachable, Feeding, Held, Lookup, NotCreated, RedisStoreConfig, Served, SessionStore,
    StepError, StepState, Stepped, StoreError,
};
use crate::body::GatewayBody;
use crate::driver::HeadWatch;
use crate::trace::TraceContext;
use crate::{GatewayConfig, Route};
use dualera_adapters::{PeerStream, RequestId, Session, Timestamp};
use dualera_common::parts::NotBuilt;
use http::header::HeaderValue;
use http::Response;
use std::sync::Arc;

pub(crate) mod client {
    //! The configuration check of the store URL.

    use dualera_common::parts::NotBuilt;

    /// Refuses any store URL: this build has no Redis client.
    pub(crate) fn check_url(_url: &str) -> Result<(), String> {
        Err(format!("session_store: {}", NotBuilt::new("redis")))
    }
}

/// Sessions in Redis: none in this build.
#[derive(Debug)]
pub(crate) enum RedisSessions {}

/// A session found in Redis: none in this build.
#[derive(Debug)]
pub(crate) enum RedisSession {}

impl RedisSessions {
    /// Refuses: this build has no Redis client.
    pub(crate) fn new(
        _store: &RedisStoreConfig,
        _config: &GatewayConfig,
    ) -> Result<Arc<Self>, StoreError> {
        Err(NotBuilt::new("redis").into())
    }

    pub(crate) fn replica(&self) -> &str {
        match *self {}
    }

    pub(crate) fn ready(&self) -> bool {
        match *self {}
    }

    pub(crate) fn round_trips(&self) -> u64 {
        match *self {}
    }

    pub(crate) fn start(self: &Arc<Self>, _gw: &Arc<Route>) {
        match **self {}
    }

    pub(crate) async fn store_all_unstored(self: &Arc<Self>, _gw: &Arc<Route>) {
        match **self {}
    }

    pub(crate) fn stop(&self) {
        match *self {}
    }

    pub(crate) fn advertise(self: &Arc<Self>) {
        match **self {}
    }

    pub(crate) async fn replica_url(&self, _replica: &str) -> Result<Option<String>, StoreError> {
        match *self {}
    }
}

/// A step's state and a waiting POST of the Redis store: none in this build.
#[derive(Debug)]
pub(crate) enum Never {}

impl StepState for Never {
    fn machine(&mut self) -> &mut Session {
        match *self {}
    }

    fn busy(&self, _peer: &PeerStream) -> bool {
        match *self {}
    }

    fn started(&mut self, _id: &RequestId) {
        match *self {}
    }

    fn open_standalone(&mut self, _auth: Option<&HeaderValue>) -> (u64, u64) {
        match *self {}
    }

    fn close_standalone(&mut self) {
        match *self {}
    }

    fn open(
        &mut self,
        _peer: &PeerStream,
        _trace: Option<&Arc<TraceContext>>,
        _auth: Option<&HeaderValue>,
    ) -> u64 {
        match *self {}
    }
}

impl SessionStore for Arc<RedisSessions> {
    type Session = RedisSession;

    async fn find(
        &self,
        _gw: &Arc<Route>,
        _id: &str,
        _authorization: Option<&HeaderValue>,
    ) -> Result<Lookup<RedisSession>, StoreError> {
        match **self {}
    }

    fn new_machine(&self, _sid: &str) -> Session {
        match **self {}
    }

    fn now(&self) -> Timestamp {
        match **self {}
    }

    async fn create(&self, _gw: &Arc<Route>, _created: Created) -> Result<(), NotCreated> {
        match **self {}
    }

    type State<'s> = Never;
    type Post = Never;
    type Hold = Never;

    async fn resume(
        &self,
        _gw: &Arc<Route>,
        session: &RedisSession,
        _number: u64,
        _after: u64,
    ) -> Result<Response<GatewayBody>, StepError<()>> {
        match *session {}
    }

    async fn hold(&self, session: &RedisSession) -> Result<Never, Held> {
        match *session {}
    }

    async fn release(&self, session: &RedisSession, _hold: Never) {
        match *session {}
    }

    fn attach(
        &self,
        _gw: &Arc<Route>,
        session: &RedisSession,
        _hold: Never,
        _number: u64,
        _seq: u64,
    ) -> Response<GatewayBody> {
        match *session {}
    }

    fn anonymous(&self, session: &RedisSession) -> bool {
        match *session {}
    }

    async fn step<I, T, R, F>(
        &self,
        _gw: &Arc<Route>,
        session: &RedisSession,
        _feeding: Feeding<'_>,
        _input: I,
        _feed: F,
    ) -> Stepped<T, R>
    where
        I: Clone + Send + Sync,
        T: Send,
        R: Send,
        F: for<'s> FnMut(&mut Never, I, Timestamp) -> Result<T, R> + Send,
    {
        match *session {}
    }

    fn post(&self, session: &RedisSession) -> Never {
        match *session {}
    }

    fn bind(&self, session: &RedisSession, _post: &mut Never, _peer: &PeerStream) {
        match *session {}
    }

    async fn first_message(
        &self,
        _session: &RedisSession,
        post: &mut Never,
        _exchange: &mut Detachable,
        _head: Option<&HeadWatch>,
    ) {
        match *post {}
    }

    async fn respond(
        &self,
        _gw: &Arc<Route>,
        _session: &RedisSession,
        post: Never,
        _number: u64,
    ) -> Response<GatewayBody> {
        match post {}
    }

    fn forget(&self, _session: &RedisSession, post: Never) {
        match post {}
    }

    async fn end(&self, _gw: &Arc<Route>, session: &RedisSession) -> Result<(), StepError<()>> {
        match *session {}
    }

    fn tag<'a>(&self, session: &'a RedisSession) -> std::borrow::Cow<'a, str> {
        match *session {}
    }

    fn served(&self, session: &RedisSession, _what: Served<'_>) {
        match *session {}
    }
}

#[cfg(test)]
mod tests {
    use crate::config::GatewaySection;
    use crate::GatewayConfig;

    #[test]
    fn a_redis_session_store_is_refused_naming_the_feature() {
        let section = GatewaySection::default();
        let err = GatewayConfig::default()
            .with_session_store(&section, Some("redis://127.0.0.1:6379/0"))
            .expect_err("no Redis in this build");
        assert_eq!(
            err,
            "session_store: this dualera was built without the `redis` feature; \
             rebuild with `--features redis`"
        );
        GatewayConfig::default()
            .with_session_store(&section, Some("memory"))
            .expect("sessions in memory need no feature");
    }
}
