//! `publish`, `tail`, `status` and `consumers`: the kcat / mosquitto_pub habits, one file
//! per subcommand.

mod consumers;
mod publish;
mod status;
mod tail;

pub use consumers::{Delete, consumers};
pub use publish::{PUBLISH_INPUT_QUEUE, PUBLISH_WINDOW, PublishArgs, PublishSummary, publish};
pub use status::status;
pub use tail::{TailArgs, TailFormat, Token, tail, topic_matches};

const CLIENT_NAME: &str = concat!("spillway-bridge/", env!("CARGO_PKG_VERSION"));
