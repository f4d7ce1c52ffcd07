//! The request path, one concern per module, composed in [`crate::stack`] in this order:
//! [`request_id`] -> [`rescue`] -> [`limits`] -> [`auth`] -> [`classify`] -> [`models`] -> [`retry`] ->
//! [`route`] -> [`rewrite`] -> [`forward`]. The response body is [`body`]: timed by
//! [`deadline`], metered by [`meter`], its request ended by [`end`].

pub mod auth;
pub mod body;
pub mod classify;
pub mod deadline;
pub mod end;
pub mod endpoint;
pub mod forward;
pub mod limits;
pub mod meter;
pub mod models;
pub mod quota;
pub mod request_id;
pub mod rescue;
pub mod retry;
pub mod rewrite;
pub mod route;
pub mod skim;
#[cfg(test)]
mod testing;
