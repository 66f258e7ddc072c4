//! The one way a role runs on every shard: a task per shard, so that a shard
//! that hangs delays only its own loop (each statement has a deadline),
//! never the others' (see DESIGN's "every shard its own fate").

use std::future::Future;
use tokio::task::JoinSet;

/// Runs `each(index)` for every shard index `0..shards`, each as a task of
/// its own, and returns when all have.
pub(crate) async fn each_shard<F, Fut>(shards: usize, each: F)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut loops = JoinSet::new();
    for index in 0..shards {
        loops.spawn(each(index));
    }
    while loops.join_next().await.is_some() {}
}
