//! The context pipeline: a pure function from a conversation and a policy to the conversation
//! sent upstream and a report of what changed. No I/O, no clock, no database.

pub mod policy;

pub use policy::Policy;
