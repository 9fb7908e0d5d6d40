// Naming the rank that stopped: when a collective times out, the ranks that are still running
// answer a roll call, and the one that does not answer is the one that stopped progressing.
//
// A collective that does not complete says nothing about which member is missing. So the first
// timed-out wait of a rank (comm_impl.cpp, PendingOp::wait) sends a short answer (its rank, what
// it was doing: the step and phase the trainer set, the operation it waits in) to every other
// rank on a communicator of its own, and collects the answers of the others for a grace period
// (they time out too: they wait, directly or through a peer, for the same rank). The ranks that
// did not answer are named; every rank that answered reaches the same list, so every message
// names the same rank. A rank that was itself frozen (SIGSTOP, or not scheduled: its wait loop
// saw a gap in time) names itself without asking, since its peers have named it already.
//
// The trainer's step watchdog (train/watchdog.hpp, on its own thread) holds one too when the
// step it watches is stuck in a collective: it asks with request_roll_call(), the thread that
// calls MPI holds it from its wait loop (serve_roll_call, called on every poll of
// comm::PendingOp::wait and parallel::CommQueue's waits) and the watchdog takes the verdict with
// roll_call_verdict().
//
// Off until enable_roll_call (the trainer turns it on): a program that provokes a timeout on
// purpose (the comm tests) keeps the plain message and its timing.
// Thread-safety: enable_roll_call and roll_call on the thread that calls MPI; set_activity
// from any thread.
#pragma once
#include <cstdint>
#include <string>

namespace tetrad::comm {

// Collective over MPI_COMM_WORLD (duplicates it). grace_s: how long a timed-out rank waits for
// the others' answers. A single-rank job: nothing to do.
void enable_roll_call(double grace_s);
bool roll_call_enabled();

// What this rank is doing, named in its answer: step `step`, `phase` ("a training step",
// "checkpoint"; a string literal).
void set_activity(int64_t step, const char* phase);

// The verdict for a wait that timed out after `waited_s` in `operation` ("allreduce_sum of 2
// float on group 'world' (rank 0 of 2)"). frozen_s > 0: the longest gap the wait loop saw
// (this process did not run). Returns "" when the roll call is off or was already held.
std::string roll_call(const std::string& operation, double waited_s, double frozen_s);

// Any thread: asks the MPI thread for a roll call (no effect when the roll call is off).
void request_roll_call();
bool roll_call_requested();  // cheap: whether one was asked for and not yet held
// The MPI thread, in a wait loop (cheap when nothing was asked): holds the roll call asked for,
// with the wait's operation and times as in roll_call(), and publishes its verdict.
void serve_roll_call(const std::string& operation, double waited_s, double frozen_s);
// Any thread: waits up to timeout_s for the verdict of the roll call asked for. False when none
// came (the MPI thread is not in a wait loop that serves it); the verdict may be "" (the roll
// call was held already).
bool roll_call_verdict(std::string* verdict, double timeout_s);
// How long a roll call listens for answers (enable_roll_call's grace_s; 0 when off).
double roll_call_grace();

}  // namespace tetrad::comm
