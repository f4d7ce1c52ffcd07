//! The request path, one concern per module, composed in [`crate::stack`] in this order:
//! [`request_id`] -> [`rescue`] -> [`auth`] -> [`classify`] -> [`route`] -> [`rewrite`] -> [`forward`], with
//! the response observed by [`body`].

pub mod auth;
pub mod body;
pub mod classify;
pub mod endpoint;
pub mod forward;
pub mod meter;
pub mod request_id;
pub mod rescue;
pub mod rewrite;
pub mod route;
pub mod skim;
