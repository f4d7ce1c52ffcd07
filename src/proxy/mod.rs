//! The request path, one concern per module, composed in [`crate::stack`] in this order:
//! [`request_id`] -> [`rescue`] -> [`limits`] -> [`auth`] -> [`classify`] -> [`models`] -> [`retry`] ->
//! [`route`] -> [`rewrite`] -> [`forward`]. The response body is [`body`]: timed by
//! [`deadline`], metered by [`meter`], its request ended by [`end`].

pub(crate) mod auth;
pub(crate) mod body;
pub(crate) mod classify;
pub(crate) mod deadline;
pub(crate) mod end;
pub(crate) mod endpoint;
pub(crate) mod forward;
pub(crate) mod limits;
pub(crate) mod meter;
pub(crate) mod models;
pub(crate) mod quota;
pub(crate) mod request_id;
pub(crate) mod rescue;
pub(crate) mod retry;
pub(crate) mod rewrite;
pub(crate) mod route;
pub(crate) mod skim;
#[cfg(test)]
mod testing;
pub(crate) mod whole;
