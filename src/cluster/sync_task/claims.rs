//! The sync task's answers to the claims of slots at a backend's edge
//! ([`crate::fleet::claim`]), between its rounds: a claim is a statement of this replica's part
//! on a condition, sent by the same task as the rounds so that statements stay in one order (a
//! round built before a claim is never applied after it).

use redis::aio::ConnectionManager;

use super::SyncTask;
use crate::cluster::sums::{self, Kind};
use crate::cluster::wire::Clock;
use crate::cluster::{lease, round};
use crate::fleet::Claimed;
use crate::fleet::claim::Claim;

/// Claims stated in one pipeline at most.
const CLAIMS_PER_CALL: usize = 64;

impl SyncTask {
    /// Answers `first` and the claims queued behind it ([`crate::fleet::claim`]): each states
    /// this replica's load on its backend, its request included, if the fleet's count there
    /// then stays within its limit; the sums read after them become the peers' load at once,
    /// before any answer goes, so that a refused request is decided again on fresh counts.
    /// Without a connection, or before the first round got through, every claim goes
    /// unanswered (the request goes on this replica's own view).
    pub(super) async fn claims(&mut self, conn: Option<&mut ConnectionManager>, first: Claim) {
        let mut asked = vec![first];
        self.inbox.claims.drain(CLAIMS_PER_CALL, &mut asked);
        let ready =
            conn.filter(|_| self.loaded && self.read_at.is_some() && !self.standing.mine.whole());
        let answers = match ready {
            Some(conn) => self.state_claims(conn, &asked).await,
            None => None,
        };
        let mut answers = answers.unwrap_or_default().into_iter();
        for claim in asked {
            let _ = claim
                .answer
                .send(answers.next().unwrap_or(Claimed::Unanswered));
        }
    }

    /// The claims' statements in one pipeline; their answers in order, `None` when the call
    /// failed.
    async fn state_claims(
        &mut self,
        conn: &mut ConnectionManager,
        asked: &[Claim],
    ) -> Option<Vec<Claimed>> {
        let clock = Clock::read();
        let (now, t_ms) = (clock.now(), clock.wall(clock.now()));
        let live = self.live.load_full();
        let classes = live.router.classes();
        let mut statements = Vec::with_capacity(asked.len());
        for claim in asked {
            let backend = live
                .router
                .backends()
                .iter()
                .find(|b| b.config.name == claim.backend)?;
            let mut fields = Vec::new();
            self.backend_fields(backend, classes, now, t_ms, &mut fields);
            let fields = self.standing.mine.changed(fields);
            statements.push((fields, sums::field(Kind::InFlight, &[&claim.backend])));
        }
        let conditions: Vec<round::Condition<'_>> = statements
            .iter()
            .zip(asked)
            .map(|((fields, field), claim)| round::Condition {
                fields,
                field,
                limit: claim.limit,
            })
            .collect();
        let part = round::Part {
            replica: &self.replica,
            incarnation: &self.incarnation,
            now_ms: t_ms,
            lease_ms: u64::try_from(lease(self.interval).as_millis()).unwrap_or(u64::MAX),
        };
        let call = round::claim(conn, &self.keys, &self.script, part, &conditions);
        // Without an answer, whether Redis took the statements is not known: the next
        // statement is whole.
        let (replies, sums) = match tokio::time::timeout(self.round_timeout(), call).await {
            Ok(Ok(answered)) => answered,
            Ok(Err(_)) => {
                // Redis may have restarted without the script; the next round says why.
                self.loaded = false;
                self.standing.mine.lost();
                return None;
            }
            Err(_) => {
                self.standing.mine.lost();
                return None;
            }
        };
        let answers = replies
            .iter()
            .zip(&statements)
            .map(|(reply, (fields, _))| match reply {
                round::ClaimReply::Granted => {
                    self.standing.mine.acknowledged(sums::Mode::Claim, fields);
                    Claimed::Granted
                }
                round::ClaimReply::Refused => Claimed::Refused,
                round::ClaimReply::Resend => {
                    self.standing.mine.lost();
                    Claimed::Unanswered
                }
            })
            .collect();
        let replicas = self.standing.totals.replicas;
        self.standing.totals.replace(replicas, sums);
        self.read_at = Some((now, t_ms));
        self.share_peers();
        Some(answers)
    }
}
