//! [`Forward`]: a wrapper of a publisher forwards every method it does not override.

use futures::future::BoxFuture;

use super::{Ack, Message, PublishError, Publisher};

/// A publisher that wraps another: every method of [`Publisher`] goes to [`inner`](Self::inner)
/// unless the wrapper overrides it, so a wrapper cannot forget to forward one (every type that
/// implements `Forward` is a [`Publisher`]). A wrapper that forgot
/// [`keeps_key_order`](Publisher::keeps_key_order) once silently cost Kafka its pipelining.
///
/// `Box<P>` and `Arc<P>` forward everything, so `Box<dyn Publisher>` and
/// `Arc<dyn Publisher>` are publishers too. Implement `Forward` for a wrapper, not
/// [`Publisher`]; write an overridden method as for [`Publisher`], with
/// `#[async_trait::async_trait]` on the impl. Its methods have [`Publisher`]'s names, and a
/// `Box` or an `Arc` has both: in the impl, call the publisher inside as `dyn Publisher`
/// (`self.inner.as_ref().send(m)`), where `self.inner.send(m)` would be ambiguous.
///
/// ```
/// use txoutbox::publish::{self, Ack, Message, PublishError, Publisher};
///
/// /// Counts what it sends; everything else is the inner publisher's.
/// struct Counting {
///     inner: Box<dyn Publisher>,
///     sent: std::sync::atomic::AtomicU64,
/// }
///
/// #[async_trait::async_trait]
/// impl publish::Forward for Counting {
///     type Inner = dyn Publisher;
///     fn inner(&self) -> &dyn Publisher {
///         &*self.inner
///     }
///     async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
///         self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         self.inner.as_ref().send(message).await
///     }
/// }
/// ```
pub trait Forward: Send + Sync + 'static {
    /// The publisher it wraps.
    type Inner: Publisher + ?Sized;

    /// The publisher it wraps, which takes every call not overridden.
    fn inner(&self) -> &Self::Inner;

    /// [`Publisher::kind`].
    fn kind(&self) -> &'static str {
        self.inner().kind()
    }

    /// [`Publisher::kind_for`].
    fn kind_for(&self, message: &Message) -> &'static str {
        self.inner().kind_for(message)
    }

    /// [`Publisher::keeps_key_order`].
    fn keeps_key_order(&self) -> bool {
        self.inner().keeps_key_order()
    }

    /// [`Publisher::destination`].
    fn destination(&self, message: &Message) -> Option<String> {
        self.inner().destination(message)
    }

    /// [`Publisher::send`]. (Written out rather than `async fn`: forwarding hands on the inner
    /// publisher's future instead of boxing it once more.)
    fn send<'life0, 'life1, 'async_trait>(
        &'life0 self,
        message: &'life1 Message,
    ) -> BoxFuture<'async_trait, Result<Ack, PublishError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.inner().send(message)
    }

    /// [`Publisher::check`].
    fn check<'life0, 'async_trait>(
        &'life0 self,
    ) -> BoxFuture<'async_trait, Result<(), PublishError>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.inner().check()
    }

    /// [`Publisher::check_for`].
    fn check_for<'life0, 'life1, 'async_trait>(
        &'life0 self,
        message: &'life1 Message,
    ) -> BoxFuture<'async_trait, Result<(), PublishError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.inner().check_for(message)
    }

    /// [`Publisher::close`]: the inner publisher is closed with its wrapper.
    fn close<'life0, 'async_trait>(
        &'life0 self,
    ) -> BoxFuture<'async_trait, Result<(), PublishError>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.inner().close()
    }
}

/// Every method goes to the [`Forward`] impl (the lint makes sure none is left to
/// [`Publisher`]'s default).
#[deny(clippy::missing_trait_methods)]
impl<T: Forward + ?Sized> Publisher for T {
    fn kind(&self) -> &'static str {
        Forward::kind(self)
    }
    fn kind_for(&self, message: &Message) -> &'static str {
        Forward::kind_for(self, message)
    }
    fn keeps_key_order(&self) -> bool {
        Forward::keeps_key_order(self)
    }
    fn destination(&self, message: &Message) -> Option<String> {
        Forward::destination(self, message)
    }
    fn send<'life0, 'life1, 'async_trait>(
        &'life0 self,
        message: &'life1 Message,
    ) -> BoxFuture<'async_trait, Result<Ack, PublishError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Forward::send(self, message)
    }
    fn check<'life0, 'async_trait>(
        &'life0 self,
    ) -> BoxFuture<'async_trait, Result<(), PublishError>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Forward::check(self)
    }
    fn check_for<'life0, 'life1, 'async_trait>(
        &'life0 self,
        message: &'life1 Message,
    ) -> BoxFuture<'async_trait, Result<(), PublishError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Forward::check_for(self, message)
    }
    fn close<'life0, 'async_trait>(
        &'life0 self,
    ) -> BoxFuture<'async_trait, Result<(), PublishError>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Forward::close(self)
    }
}

/// A boxed publisher is the publisher in the box.
impl<P: Publisher + ?Sized> Forward for Box<P> {
    type Inner = P;
    fn inner(&self) -> &P {
        self
    }
}

/// A shared publisher is the publisher shared; closing it closes that one, for every holder
/// (see [`Publisher::close`]).
impl<P: Publisher + ?Sized> Forward for std::sync::Arc<P> {
    type Inner = P;
    fn inner(&self) -> &P {
        self
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::publish::{ready_ack, FaultyPublisher};

    /// Answers every method with something no default gives, and counts its closes.
    #[derive(Default)]
    pub(crate) struct Probe {
        pub closed: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Publisher for Probe {
        fn kind(&self) -> &'static str {
            "probe"
        }
        fn kind_for(&self, _: &Message) -> &'static str {
            "probe-for"
        }
        fn keeps_key_order(&self) -> bool {
            true
        }
        fn destination(&self, m: &Message) -> Option<String> {
            Some(format!("dest.{}", m.aggregate_type))
        }
        async fn send(&self, _: &Message) -> Result<Ack, PublishError> {
            Ok(ready_ack(Err(PublishError::permanent("probe ack"))))
        }
        async fn check(&self) -> Result<(), PublishError> {
            Err(PublishError::unavailable("probe check"))
        }
        async fn check_for(&self, _: &Message) -> Result<(), PublishError> {
            Err(PublishError::transient("probe check_for"))
        }
        async fn close(&self) -> Result<(), PublishError> {
            self.closed.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    pub(crate) fn message() -> Message {
        Message {
            id: uuid::Uuid::nil(),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "created".into(),
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
            headers: Default::default(),
            created_at: chrono::DateTime::from_timestamp(0, 0).unwrap(),
            attempt: 1,
        }
    }

    /// `p` answers as the [`Probe`] it wraps, for every method, and closes it once.
    pub(crate) async fn forwards_everything(p: &dyn Publisher, probe: &Probe) {
        let m = message();
        assert_eq!(p.kind(), "probe");
        assert_eq!(p.kind_for(&m), "probe-for");
        assert!(p.keeps_key_order(), "keeps_key_order must be forwarded");
        assert_eq!(p.destination(&m).as_deref(), Some("dest.order"));
        let ack = p.send(&m).await.unwrap().await.unwrap_err();
        assert_eq!(ack.chain(), "probe ack");
        assert_eq!(p.check().await.unwrap_err().chain(), "probe check");
        assert_eq!(
            p.check_for(&m).await.unwrap_err().chain(),
            "probe check_for"
        );
        let before = probe.closed.load(Ordering::SeqCst);
        p.close().await.unwrap();
        assert_eq!(probe.closed.load(Ordering::SeqCst), before + 1);
    }

    /// Overrides `kind` only.
    struct Renamed(Arc<Probe>);

    impl Forward for Renamed {
        type Inner = Probe;
        fn inner(&self) -> &Probe {
            &self.0
        }
        fn kind(&self) -> &'static str {
            "renamed"
        }
    }

    /// `Box`, `Arc`, [`FaultyPublisher`] and a wrapper of one's own answer as the publisher
    /// they wrap, in every method they do not override: `keeps_key_order` and `destination`
    /// too (a wrapper that forgot `keeps_key_order` once cost Kafka its pipelining).
    #[tokio::test]
    async fn wrappers_forward_what_they_do_not_override() {
        let probe = Arc::new(Probe::default());
        let shared: Arc<dyn Publisher> = probe.clone();
        let wrappers: [Box<dyn Publisher>; 5] = [
            Box::new(probe.clone()),
            Box::new(Box::new(probe.clone())),
            Box::new(shared.clone()),
            Box::new(Box::new(shared.clone()) as Box<dyn Publisher>),
            Box::new(FaultyPublisher::new(Box::new(shared), 0.0, 1)),
        ];
        for w in &wrappers {
            forwards_everything(&**w, &probe).await;
        }

        let renamed = Renamed(probe.clone());
        assert_eq!(Publisher::kind(&renamed), "renamed");
        assert!(Publisher::keeps_key_order(&renamed));
        assert_eq!(
            Publisher::destination(&renamed, &message()).as_deref(),
            Some("dest.order")
        );
        assert_eq!(probe.closed.load(Ordering::SeqCst), 5);
    }
}
