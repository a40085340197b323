//! The contract suite (feature `testing`; **not API-stable**): the cases every
//! [`LockBackend`](crate::LockBackend) must pass — ours (memory, MongoDB, PostgreSQL) and your own.
//!
//! A backend's test file provides `async fn setup() -> Env` (a backend on fresh, isolated
//! storage; or `Option<Env>`, `None` skipping with a printed reason) and invokes
//! `mongolock::contract_suite!(setup)`, which generates one `#[tokio::test]` per case (the test
//! crate needs `tokio` with the `macros` and `rt-multi-thread` features):
//!
//! ```
//! use std::sync::Arc;
//! use mongolock::testing::Env;
//!
//! async fn setup() -> Env {
//!     Env::new(Arc::new(mongolock::MemoryBackend::new())).with_notifications()
//! }
//!
//! mongolock::contract_suite!(setup);
//! # fn main() {}
//! ```
//!
//! # Writing a backend
//! A backend implements [`LockBackend`](crate::LockBackend): single atomic attempts (acquire, extend, release,
//! release with a minimum hold, force-release, inspect, list), judged by the store's clock.
//! The rules those operations must follow, and why the core's guarantees follow from them,
//! are the [backend contract](crate::backend); the core supplies waiting, retries, renewal,
//! loss detection and cancellation safety. A backend that learns of changes as they happen
//! also implements [`ChangeNotifications`](crate::backend::ChangeNotifications) and declares it with
//! [`Env::with_notifications`], which adds the cases for wake-ups and early loss detection.
//! The suite then checks the rules on your store: mutual exclusion under contention, tokens
//! across release, expiry, takeover and force-release, ownership, idempotent release, slots,
//! read-write locks, lock sets, minimum holds and guard edges. mongolock's own backends run
//! it from `crates/mongolock/tests/` (the MongoDB run against `mongo-testserver`, or a real
//! deployment when `MONGODB_URI` is set).
//!
//! Cases panic on a contract violation, as tests do. The change-notification cases (a
//! force-release signalled to the holder at once, a release waking a waiter at once, handoffs
//! without a stampede) run only for an [`Env`] declared
//! [`with_notifications`](Env::with_notifications); for other backends they skip with a printed
//! reason. The leader-election cases give each candidate its own provider: over a backend of
//! its own when the [`Env`] has a [`backend factory`](Env::with_backend_factory) (as separate
//! processes would have), else over the shared backend; a backend that runs no tasks of its
//! own can say so ([`without_background_tasks`](Env::without_background_tasks)) to have the
//! cases check that nothing is left running.
//! Cases wait with generous deadlines and poll instead of asserting tight timings.
//!
//! The suite's files: this module (the [`contract_suite!`](crate::contract_suite) macro, which
//! lists every case), `harness` ([`Env`], [`IntoEnv`] and the helpers cases share), `wrappers`
//! (backends that count calls or lose replies, wrapped around the backend under test) and
//! `cases/`, one module per topic (locks, extension, release, timeouts, cancellation,
//! notifications, leader election, semaphores, read-write locks, lock sets, minimum hold, lease edges, the
//! operator's view). Everything public is re-exported here: a case is
//! `mongolock::testing::<case name>`.

mod cases;
mod harness;
#[cfg(all(feature = "postgres", unix))]
pub mod postgres_server;
mod wrappers;

pub use cases::*;
pub use harness::*;
pub use wrappers::*;

/// Generates one test per contract case for a backend.
#[macro_export]
macro_rules! contract_suite {
    ($setup:path) => {
        $crate::contract_suite!(@cases $setup;
            mutual_exclusion,
            expiry_and_takeover,
            extend_semantics,
            release_checks_ownership,
            fencing_tokens_grow,
            timeout_zero_is_one_attempt,
            timeout_finite_returns_none_on_time,
            timeout_forever_waits_until_released,
            dropped_acquire_futures_leave_nothing_held,
            auto_extension_keeps_others_out,
            bad_input_is_rejected_before_the_backend,
            inspect_and_list_show_the_holder,
            force_release_ends_the_lease_and_signals_loss,
            dropping_a_guard_releases,
            dropping_a_release_future_still_releases,
            with_expiry_sets_the_lease_duration,
            release_is_idempotent_for_the_owner,
            a_lost_grant_is_released_when_the_call_gives_up,
            semaphore_never_exceeds_its_limit,
            semaphore_tokens_grow_across_slots,
            semaphore_slot_returns_after_a_crashed_holders_lease,
            an_expired_slot_taken_by_a_lock_reports_its_loss,
            semaphore_bad_limits_are_typed_errors,
            semaphore_and_lock_on_one_name_exclude_each_other,
            semaphore_slots_are_separate_leases,
            holders_shows_every_slot_holder,
            dropped_semaphore_acquires_leave_no_slot_held,
            rwlock_readers_overlap_and_a_writer_excludes_everyone,
            rwlock_tokens_are_shared_by_readers_and_writers,
            rwlock_a_waiting_writer_is_not_starved,
            dropped_rwlock_acquires_leave_nothing_held,
            a_shortened_extension_without_a_reply_ends_the_lease,
            an_unanswered_short_extension_overtaken_by_a_longer_one_ends_the_lease,
            an_abandoned_attempt_that_grants_later_is_released,
            min_hold_keeps_the_name_until_granted_plus_min_hold,
            min_hold_already_passed_is_a_plain_release,
            force_release_ends_a_min_hold,
            min_hold_is_idempotent_and_refuses_extension,
            force_release_token_ends_only_that_lease,
            force_release_token_ends_one_semaphore_slot,
            list_matching_filters_by_prefix_and_state,
            lock_sets_in_opposite_orders_never_deadlock,
            a_timed_out_lock_set_leaves_nothing_held,
            dropped_lock_set_acquires_leave_nothing_held,
            a_lock_set_guard_reports_any_loss_and_releases_all,
            a_lock_set_keeps_the_names_it_holds_while_waiting,
        );
        $crate::contract_suite!(@notifications $setup;
            force_release_is_signalled_to_the_holder_at_once,
            a_release_wakes_a_waiter_at_once,
            handoffs_are_prompt_and_do_not_stampede,
            a_slot_release_wakes_a_waiter_at_once,
            waiters_show_who_waits,
        );
        $crate::contract_suite!(@env $setup;
            one_leader_at_a_time_and_terms_increase,
            resign_hands_over_to_exactly_one_candidate,
            crashed_leader_is_replaced_once_after_expiry,
            lost_leadership_cancels_the_function_and_campaigns_again,
            observe_without_campaigning,
            dropping_the_run_future_leaves_nothing_held,
            try_campaign_and_input_checks,
        );
    };
    (@cases $setup:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                // A setup may return `Option<Env>`: `None` skips (it printed why).
                let Some(env) = $crate::testing::IntoEnv::into_env($setup().await) else {
                    return;
                };
                $crate::testing::$case(env.backend.clone()).await;
                drop(env);
            }
        )*
    };
    (@env $setup:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some(env) = $crate::testing::IntoEnv::into_env($setup().await) else {
                    return;
                };
                $crate::testing::$case(&env).await;
                drop(env);
            }
        )*
    };
    (@notifications $setup:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some(env) = $crate::testing::IntoEnv::into_env($setup().await) else {
                    return;
                };
                if !env.notifications {
                    eprintln!("skipped: the backend declares no change notifications");
                    return;
                }
                $crate::testing::$case(env.backend.clone()).await;
                drop(env);
            }
        )*
    };
}
