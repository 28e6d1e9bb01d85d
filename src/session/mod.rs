//! Sessions: which stored conversation a request continues (`resolve`), the lease that
//! serialises requests on one session across processes (`lock`), replies still being written
//! after their answer went out (`pending`), Responses item references to stored replies
//! (`references`), the conversation to send
//! under each history mode (`history`), and opening a request's turn on its session (`turn`).

pub mod history;
pub mod lock;
pub mod pending;
pub mod references;
pub mod resolve;
pub mod turn;

pub use history::{Assembled, assemble};
pub use lock::SessionLock;
pub use pending::{PendingReplies, PendingWrite};
pub use resolve::{Resolved, resolve};
