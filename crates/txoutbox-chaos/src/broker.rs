//! The broker the relays publish to, run privately for the run: NATS JetStream or RabbitMQ.
//! What differs between them: how it is started and restarted, the relays' publisher URL,
//! the protocol the proxies tap, and how the checker reads what arrived.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use uuid::Uuid;

use crate::amqp_consumer::Consumer;
use crate::check;
use crate::cluster::NatsServer;
use crate::proxy::Tap;
use crate::rabbit::{self, RabbitNode};
use crate::Args;

/// The JetStream stream of a NATS run.
const STREAM: &str = "CHAOS";
/// The exchange and the queue of a RabbitMQ run.
const EXCHANGE: &str = "chaos";
const QUEUE: &str = "chaos";
/// Before a RabbitMQ restart the consumer pauses this long, so the queue holds messages.
const QUEUE_FILL: Duration = Duration::from_secs(2);

/// Which broker, as `--publisher` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    Nats,
    Amqp,
}

impl BrokerKind {
    pub fn parse(publisher: &str) -> anyhow::Result<Self> {
        match publisher {
            "nats" => Ok(Self::Nats),
            "amqp" => Ok(Self::Amqp),
            other => anyhow::bail!("unknown publisher {other:?} (known: nats, amqp)"),
        }
    }

    /// The relays' `--publisher`, through their proxy on `port`.
    pub fn relay_url(self, port: u16) -> String {
        match self {
            Self::Nats => format!(
                "nats://127.0.0.1:{port}?stream={STREAM}&subject=chaos.{{aggregate_type}}.{{event_type}}&create_stream=false&ack_timeout=3s&connect_timeout=3s"
            ),
            // Persistent messages (always) into a durable queue: a broker restart keeps them.
            Self::Amqp => format!(
                "amqp://guest:guest@127.0.0.1:{port}/%2f?exchange={EXCHANGE}&routing_key=chaos.{{aggregate_type}}.{{event_type}}&bind_queue={QUEUE}&confirm_timeout=3s&connect_timeout=3s"
            ),
        }
    }

    /// What the relays' broker proxies read to see each send.
    pub fn tap(self) -> Tap {
        match self {
            Self::Nats => Tap::Nats,
            Self::Amqp => Tap::Amqp,
        }
    }
}

/// The running broker.
pub enum Broker {
    Nats(NatsServer),
    Amqp {
        node: RabbitNode,
        /// Started by `prepare`, ended by `deliveries`.
        consumer: Option<Consumer>,
        /// Per restart: how long the start took, messages ready in the queue at the stop.
        restarts: Vec<(Duration, u32)>,
    },
}

impl Broker {
    pub async fn start(args: &Args, root: &Path) -> anyhow::Result<Self> {
        Ok(match BrokerKind::parse(&args.publisher)? {
            BrokerKind::Nats => Self::Nats(
                NatsServer::start(&args.nats_server, root)
                    .await
                    .context("start nats-server")?,
            ),
            BrokerKind::Amqp => {
                let node = RabbitNode::start(&args.rabbitmq_server, root)
                    .await
                    .context("start a private RabbitMQ node")?;
                eprintln!("chaos: RabbitMQ node started in {:.1?}", node.last_start);
                Self::Amqp {
                    node,
                    consumer: None,
                    restarts: Vec::new(),
                }
            }
        })
    }

    pub fn kind(&self) -> BrokerKind {
        match self {
            Self::Nats(_) => BrokerKind::Nats,
            Self::Amqp { .. } => BrokerKind::Amqp,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Nats(_) => "NATS",
            Self::Amqp { .. } => "RabbitMQ",
        }
    }

    /// Where it listens (the relays go through their proxies instead).
    pub fn url(&self) -> String {
        match self {
            Self::Nats(n) => n.url(),
            Self::Amqp { node, .. } => node.url(),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        match self {
            Self::Nats(n) => n.addr(),
            Self::Amqp { node, .. } => SocketAddr::from(([127, 0, 0, 1], node.port())),
        }
    }

    /// Before the relays start: the stream (NATS), or the exchange, the queue and the
    /// consumer (RabbitMQ).
    pub async fn prepare(&mut self) -> anyhow::Result<()> {
        match self {
            Self::Nats(n) => create_stream(&n.url()).await,
            Self::Amqp { node, consumer, .. } => {
                rabbit::declare(&node.url(), EXCHANGE, QUEUE).await?;
                *consumer = Some(Consumer::start(&node.url(), QUEUE));
                Ok(())
            }
        }
    }

    /// Stop it cleanly and start it again on the same port and store.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        match self {
            Self::Nats(n) => n.restart().await,
            Self::Amqp {
                node,
                consumer,
                restarts,
            } => {
                // Let the queue fill for a moment, so the restart has messages to keep.
                if let Some(c) = consumer {
                    c.pause();
                }
                tokio::time::sleep(QUEUE_FILL).await;
                let held = rabbit::ready_messages(&node.url(), QUEUE).await?;
                eprintln!("chaos: RabbitMQ stops with {held} messages ready in the queue (consumer paused {QUEUE_FILL:?})");
                node.restart().await?;
                if let Some(c) = consumer {
                    c.resume();
                }
                restarts.push((node.last_start, held));
                Ok(())
            }
        }
    }

    /// Every message that arrived, as event ids in the order the broker holds (or delivered)
    /// them, duplicates included; and a line about the consumer, if there is something to say.
    /// Call once the relays have stopped.
    pub async fn deliveries(&mut self) -> anyhow::Result<(Vec<Uuid>, Option<String>)> {
        match self {
            Self::Nats(n) => Ok((check::read_stream(&n.url(), STREAM).await?, None)),
            Self::Amqp {
                consumer, restarts, ..
            } => {
                let c = consumer
                    .take()
                    .context("the RabbitMQ consumer was not started")?;
                let (ids, reconnects) = c.finish().await?;
                let took = match restarts.iter().map(|r| r.0).max() {
                    Some(slowest) => format!(
                        " (each start took up to {slowest:.1?}; messages in the queue at the stops: {})",
                        restarts.iter().map(|r| r.1).sum::<u32>()
                    ),
                    None => String::new(),
                };
                Ok((
                    ids,
                    Some(format!(
                        "broker: RabbitMQ restarts={}{took} consumer reconnects={reconnects}",
                        restarts.len()
                    )),
                ))
            }
        }
    }
}

/// The stream, created by us with a 100 ms duplicate window (the server's minimum): JetStream then keeps (nearly) every copy a
/// relay sends, and the checker counts the duplicates instead of the broker hiding them.
async fn create_stream(url: &str) -> anyhow::Result<()> {
    let client = async_nats::connect(url).await.context("connect to NATS")?;
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["chaos.>".into()],
        storage: async_nats::jetstream::stream::StorageType::File,
        duplicate_window: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .context("create the stream")?;
    Ok(())
}
