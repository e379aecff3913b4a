// mc::etcd (libcommon/coord/include/mc/coord/etcd.hpp) against a real etcd started by testkit::EtcdCluster: key-value
// calls, transactions, leases, watches (also across a killed member of three) and the errors of an unreachable
// cluster. Skips with the reason when /usr/bin/etcd is not installed. Waits are bounded (wait_until), never sleeps.
#include "mc/coord/etcd.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mc/net/auth.hpp"
#include "mc/testkit/etcd.hpp"
#include "mc/testkit/wait.hpp"

namespace mc {
namespace MC_UNITY_ID {

using etcd::Client;
using etcd::Compare;
using etcd::Op;
using etcd::Watch;
using etcd::WatchEvent;
using testkit::EtcdCluster;
using testkit::wait_until;

#define START_ETCD(members)                                                    \
  do {                                                                         \
    if (!EtcdCluster::installed()) GTEST_SKIP() << EtcdCluster::kNotInstalled; \
    cluster_ = std::make_unique<EtcdCluster>(members);                         \
    ASSERT_TRUE(cluster_->start()) << cluster_->error();                       \
    client_ = std::make_unique<Client>(cluster_->options());                   \
  } while (0)

// What a watch delivered, for assertions from the test thread.
struct Seen {
  std::mutex mu;
  std::vector<WatchEvent> events;
  std::vector<int64_t> batch_revisions;
  std::vector<Status> errors;

  Watch::EventsFn events_fn() {
    return [this](const std::vector<WatchEvent>& batch, int64_t revision) {
      std::lock_guard<std::mutex> lock(mu);
      events.insert(events.end(), batch.begin(), batch.end());
      batch_revisions.push_back(revision);
    };
  }
  Watch::ErrorFn error_fn() {
    return [this](const Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(s);
    };
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return events.size();
  }
  std::vector<WatchEvent> snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return events;
  }
  size_t error_count() {
    std::lock_guard<std::mutex> lock(mu);
    return errors.size();
  }
};

class EtcdTest : public ::testing::Test {
 protected:
  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<Client> client_;
};

int64_t ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
}

// ---- no etcd needed ----

TEST(EtcdEndpoints, ParsesListsAndNamesTheBadEntry) {
  auto ok = etcd::parse_endpoints("127.0.0.1:2379, http://10.0.0.2:22379/,[::1]:2379");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->endpoints,
            (std::vector<std::string>{"http://127.0.0.1:2379", "http://10.0.0.2:22379", "http://[::1]:2379"}));
  EXPECT_EQ(ok->timeout_ms, 2000);

  auto tls = etcd::parse_endpoints("127.0.0.1:2379,https://10.0.0.2:2379");
  ASSERT_FALSE(tls.is_ok());
  EXPECT_EQ(tls.status().code(), Code::kInvalidArgument);
  EXPECT_NE(tls.status().message().find("https://10.0.0.2:2379"), std::string::npos) << tls.status().message();
  EXPECT_NE(tls.status().message().find("TLS"), std::string::npos) << tls.status().message();

  for (const char* bad : {"", "127.0.0.1:2379,,127.0.0.1:2380", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999",
                          "unix:///tmp/etcd.sock", "*:2379"}) {
    auto r = etcd::parse_endpoints(bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
  auto port = etcd::parse_endpoints("127.0.0.1:2379,127.0.0.1:x");
  ASSERT_FALSE(port.is_ok());
  EXPECT_NE(port.status().message().find("entry \"127.0.0.1:x\""), std::string::npos) << port.status().message();
}

TEST(EtcdEndpoints, PrefixEnd) {
  EXPECT_EQ(etcd::prefix_end("a/"), "a0");
  EXPECT_EQ(etcd::prefix_end("ab"), "ac");
  EXPECT_EQ(etcd::prefix_end(std::string("a\xff", 2)), "b");
  EXPECT_EQ(etcd::prefix_end(std::string("\xff\xff", 2)), std::string(1, '\0'));
  EXPECT_EQ(etcd::prefix_end(""), std::string(1, '\0'));
}

// A listening socket that never accepts: connections complete in the kernel, requests are never answered.
struct BlackHole {
  int fd = -1;
  uint16_t port = 0;
  BlackHole() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 16) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
  }
  ~BlackHole() { ::close(fd); }
  BlackHole(const BlackHole&) = delete;
  BlackHole& operator=(const BlackHole&) = delete;
};

TEST(EtcdUnreachable, EveryEndpointFailedIsUnavailableWithinTheTimeout) {
  BlackHole hole;
  ASSERT_NE(hole.port, 0);
  const uint16_t closed = testkit::free_loopback_port();  // nothing listens there
  etcd::Options o;
  o.endpoints = {"127.0.0.1:" + std::to_string(closed), "127.0.0.1:" + std::to_string(hole.port)};
  o.timeout_ms = 300;
  Client c(o);

  auto t0 = std::chrono::steady_clock::now();
  auto r = c.range("k");
  ASSERT_FALSE(r.is_ok());
  EXPECT_LT(ms_since(t0), 2000);
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find(o.endpoints[0]), std::string::npos) << m;
  EXPECT_NE(m.find(o.endpoints[1]), std::string::npos) << m;
  EXPECT_NE(m.find("is etcd running?"), std::string::npos) << m;
  EXPECT_NE(m.find("\"k\""), std::string::npos) << m;

  // A write refused before it was sent fails over; one that timed out after being sent is not repeated.
  etcd::Options refused;
  refused.endpoints = {o.endpoints[0]};
  refused.timeout_ms = 300;
  auto p = Client(refused).put("k", "v");
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), Code::kUnavailable);
  EXPECT_NE(p.status().message().find("no endpoint answered"), std::string::npos) << p.status().message();

  etcd::Options hole_first;
  hole_first.endpoints = {o.endpoints[1], o.endpoints[0]};
  hole_first.timeout_ms = 300;
  t0 = std::chrono::steady_clock::now();
  auto q = Client(hole_first).put("k", "v");
  ASSERT_FALSE(q.is_ok());
  EXPECT_LT(ms_since(t0), 2000);
  EXPECT_EQ(q.status().code(), Code::kUnavailable);
  EXPECT_NE(q.status().message().find("may or may not have been applied"), std::string::npos) << q.status().message();

  // A watch on nothing retries in the background and stops promptly.
  Seen seen;
  Watch w(o, "k", "", 0, seen.events_fn(), seen.error_fn());
  EXPECT_TRUE(w.running());
  t0 = std::chrono::steady_clock::now();
  w.stop();
  EXPECT_LT(ms_since(t0), 500);
  EXPECT_FALSE(w.running());
  EXPECT_EQ(seen.error_count(), 0u);
}

// ---- one member ----

TEST_F(EtcdTest, PutRangeDeleteRoundTripWithBinaryValuesAndPrefixes) {
  START_ETCD(1);
  const std::string binary("v\0a\xff\0\x01z", 7);
  const std::string binary_key("bin/\0key\xfe", 9);
  auto r1 = client_->put("rt/a", binary);
  ASSERT_TRUE(r1.is_ok()) << r1.status().to_string();
  auto r2 = client_->put(binary_key, "x");
  ASSERT_TRUE(r2.is_ok()) << r2.status().to_string();
  EXPECT_GT(*r2, *r1);
  ASSERT_TRUE(client_->put("rt/b", "").is_ok());
  ASSERT_TRUE(client_->put("rt/c", "3").is_ok());
  ASSERT_TRUE(client_->put("rt0", "outside the prefix").is_ok());

  auto one = client_->range("rt/a");
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  ASSERT_EQ(one->kvs.size(), 1u);
  EXPECT_EQ(one->kvs[0].key, "rt/a");
  EXPECT_EQ(one->kvs[0].value, binary);
  EXPECT_EQ(one->kvs[0].create_revision, *r1);
  EXPECT_EQ(one->kvs[0].mod_revision, *r1);
  EXPECT_EQ(one->kvs[0].version, 1);
  EXPECT_EQ(one->count, 1);
  EXPECT_GE(one->revision, *r2);

  auto bin = client_->range(binary_key);
  ASSERT_TRUE(bin.is_ok()) << bin.status().to_string();
  ASSERT_EQ(bin->kvs.size(), 1u);
  EXPECT_EQ(bin->kvs[0].key, binary_key);

  auto prefix = client_->range("rt/", etcd::prefix_end("rt/"));
  ASSERT_TRUE(prefix.is_ok()) << prefix.status().to_string();
  ASSERT_EQ(prefix->kvs.size(), 3u);
  EXPECT_EQ(prefix->kvs[0].key, "rt/a");
  EXPECT_EQ(prefix->kvs[1].key, "rt/b");
  EXPECT_EQ(prefix->kvs[1].value, "");
  EXPECT_EQ(prefix->kvs[2].key, "rt/c");
  EXPECT_FALSE(prefix->more);

  auto limited = client_->range("rt/", etcd::prefix_end("rt/"), 0, 2);
  ASSERT_TRUE(limited.is_ok());
  EXPECT_EQ(limited->kvs.size(), 2u);
  EXPECT_TRUE(limited->more);
  EXPECT_EQ(limited->count, 3);

  // Every key, from the first ("" becomes "\0").
  auto all = client_->range("", etcd::prefix_end(""));
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(all->kvs.size(), 5u);

  // An older revision still holds the first value of an overwritten key.
  ASSERT_TRUE(client_->put("rt/a", "second").is_ok());
  auto old = client_->range("rt/a", "", *r1);
  ASSERT_TRUE(old.is_ok()) << old.status().to_string();
  ASSERT_EQ(old->kvs.size(), 1u);
  EXPECT_EQ(old->kvs[0].value, binary);

  auto missing = client_->range("rt/none");
  ASSERT_TRUE(missing.is_ok());
  EXPECT_TRUE(missing->kvs.empty());
  EXPECT_EQ(missing->count, 0);

  auto d = client_->del("rt/", etcd::prefix_end("rt/"));
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  auto after = client_->range("rt/", etcd::prefix_end("rt/"));
  ASSERT_TRUE(after.is_ok());
  EXPECT_TRUE(after->kvs.empty());
  EXPECT_EQ(after->revision, *d);
  auto outside = client_->range("rt0");
  ASSERT_TRUE(outside.is_ok());
  EXPECT_EQ(outside->kvs.size(), 1u);

  // A future revision is etcd's error, with its message.
  auto future = client_->range("rt/a", "", *d + 1000);
  ASSERT_FALSE(future.is_ok());
  EXPECT_EQ(future.status().code(), Code::kOutOfRange);
  EXPECT_NE(future.status().message().find("future revision"), std::string::npos) << future.status().message();
  EXPECT_NE(future.status().message().find(cluster_->endpoint(0)), std::string::npos) << future.status().message();
}

TEST_F(EtcdTest, TxnCreateIfAbsentTakesTheSuccessBranchOnceThenTheFailureBranch) {
  START_ETCD(1);
  const std::vector<Compare> absent = {
      Compare{"txn/leader", Compare::Target::kCreateRevision, Compare::Result::kEqual, 0, ""}};
  auto first = client_->txn(absent, {Op::put("txn/leader", "me"), Op::get("txn/leader")}, {Op::get("txn/leader")});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_TRUE(first->succeeded);
  ASSERT_EQ(first->ranges.size(), 1u);
  ASSERT_EQ(first->ranges[0].kvs.size(), 1u);
  EXPECT_EQ(first->ranges[0].kvs[0].value, "me");
  EXPECT_EQ(first->ranges[0].kvs[0].create_revision, first->revision);

  auto second = client_->txn(absent, {Op::put("txn/leader", "you")}, {Op::get("txn/leader"), Op::get("txn/", "txn0")});
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_FALSE(second->succeeded);
  EXPECT_EQ(second->revision, first->revision);
  ASSERT_EQ(second->ranges.size(), 2u);
  ASSERT_EQ(second->ranges[0].kvs.size(), 1u);
  EXPECT_EQ(second->ranges[0].kvs[0].value, "me");
  EXPECT_EQ(second->ranges[1].count, 1);

  // Compare on the value and on mod_revision; delete in a branch.
  const int64_t mod = first->ranges[0].kvs[0].mod_revision;
  auto third = client_->txn({Compare{"txn/leader", Compare::Target::kValue, Compare::Result::kEqual, 0, "me"},
                             Compare{"txn/leader", Compare::Target::kModRevision, Compare::Result::kEqual, mod, ""}},
                            {Op::del("txn/leader")});
  ASSERT_TRUE(third.is_ok()) << third.status().to_string();
  EXPECT_TRUE(third->succeeded);
  EXPECT_TRUE(third->ranges.empty());
  auto gone = client_->range("txn/leader");
  ASSERT_TRUE(gone.is_ok());
  EXPECT_TRUE(gone->kvs.empty());
}

TEST_F(EtcdTest, LeaseGrantKeepaliveAndRevokeRemovesItsKeys) {
  START_ETCD(1);
  auto lease = client_->lease_grant(30);
  ASSERT_TRUE(lease.is_ok()) << lease.status().to_string();
  EXPECT_NE(*lease, 0);
  ASSERT_TRUE(client_->put("lease/k", "v", *lease).is_ok());
  auto got = client_->range("lease/k");
  ASSERT_TRUE(got.is_ok());
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].lease, *lease);

  auto ttl = client_->lease_keepalive(*lease);
  ASSERT_TRUE(ttl.is_ok()) << ttl.status().to_string();
  EXPECT_GT(*ttl, 0);
  EXPECT_LE(*ttl, 30);

  ASSERT_TRUE(client_->lease_revoke(*lease).is_ok());
  auto after = client_->range("lease/k");
  ASSERT_TRUE(after.is_ok());
  EXPECT_TRUE(after->kvs.empty());

  auto dead = client_->lease_keepalive(*lease);
  ASSERT_FALSE(dead.is_ok());
  EXPECT_EQ(dead.status().code(), Code::kNotFound);
  const Status again = client_->lease_revoke(*lease);
  EXPECT_EQ(again.code(), Code::kNotFound) << again.to_string();
  EXPECT_NE(again.message().find("lease not found"), std::string::npos) << again.message();
  auto put = client_->put("lease/k", "v", *lease);
  ASSERT_FALSE(put.is_ok());
  EXPECT_EQ(put.status().code(), Code::kNotFound);
  EXPECT_NE(put.status().message().find("\"lease/k\""), std::string::npos) << put.status().message();
}

TEST_F(EtcdTest, AnExpiredLeaseDeletesItsKey) {
  START_ETCD(1);
  auto lease = client_->lease_grant(1);
  ASSERT_TRUE(lease.is_ok()) << lease.status().to_string();
  ASSERT_TRUE(client_->put("expiry/k", "v", *lease).is_ok());
  const bool gone = wait_until(
      [&] {
        auto r = client_->range("expiry/k");
        return r.is_ok() && r->kvs.empty();
      },
      10'000, 50);
  EXPECT_TRUE(gone);
  auto ka = client_->lease_keepalive(*lease);
  EXPECT_EQ(ka.status().code(), Code::kNotFound);
}

TEST_F(EtcdTest, WatchDeliversPutsAndDeletesInOrderAlsoFromAPastRevision) {
  START_ETCD(1);
  auto base = client_->range("w/");
  ASSERT_TRUE(base.is_ok());
  const int64_t from = base->revision + 1;

  Seen live;
  Watch w(cluster_->options(), "w/", etcd::prefix_end("w/"), from, live.events_fn(), live.error_fn());
  std::vector<int64_t> revs;
  for (const char* k : {"w/a", "w/b", "outside", "w/a"}) {
    auto r = client_->put(k, std::string("value of ") + k);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    if (std::string(k) != "outside") revs.push_back(*r);
  }
  auto d = client_->del("w/b");
  ASSERT_TRUE(d.is_ok());
  revs.push_back(*d);

  ASSERT_TRUE(wait_until([&] { return live.count() >= 4; }, 10'000));
  auto check = [&](const std::vector<WatchEvent>& ev) {
    ASSERT_EQ(ev.size(), 4u);
    EXPECT_EQ(ev[0].type, WatchEvent::Type::kPut);
    EXPECT_EQ(ev[0].kv.key, "w/a");
    EXPECT_EQ(ev[0].kv.value, "value of w/a");
    EXPECT_EQ(ev[1].kv.key, "w/b");
    EXPECT_EQ(ev[2].kv.key, "w/a");
    EXPECT_EQ(ev[2].kv.version, 2);
    EXPECT_EQ(ev[3].type, WatchEvent::Type::kDelete);
    EXPECT_EQ(ev[3].kv.key, "w/b");
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ev[i].kv.mod_revision, revs[i]) << i;
  };
  check(live.snapshot());

  // A second watch from the same past revision, opened after the writes, replays the same history.
  Seen past;
  Watch w2(cluster_->options(), "w/", etcd::prefix_end("w/"), from, past.events_fn(), past.error_fn());
  ASSERT_TRUE(wait_until([&] { return past.count() >= 4; }, 10'000));
  check(past.snapshot());

  // Nothing more arrives for a write outside the range; a later write in it does, once.
  ASSERT_TRUE(client_->put("outside", "again").is_ok());
  auto last = client_->put("w/c", "c");
  ASSERT_TRUE(last.is_ok());
  ASSERT_TRUE(wait_until([&] { return live.count() >= 5 && past.count() >= 5; }, 10'000));
  EXPECT_EQ(live.snapshot().back().kv.mod_revision, *last);
  EXPECT_EQ(live.count(), 5u);
  EXPECT_EQ(live.error_count(), 0u);

  const auto t0 = std::chrono::steady_clock::now();
  w.stop();
  EXPECT_LT(ms_since(t0), 500);
  EXPECT_FALSE(w.running());
  EXPECT_TRUE(w2.running());
}

TEST_F(EtcdTest, WatchFromACompactedRevisionReportsDataLossAndStops) {
  START_ETCD(1);
  auto r1 = client_->put("c/k", "1");
  ASSERT_TRUE(r1.is_ok());
  ASSERT_TRUE(client_->put("c/k", "2").is_ok());
  auto r3 = client_->put("c/k", "3");
  ASSERT_TRUE(r3.is_ok());
  ASSERT_TRUE(client_->compact(*r3).is_ok());

  auto old = client_->range("c/k", "", *r1);
  ASSERT_FALSE(old.is_ok());
  EXPECT_EQ(old.status().code(), Code::kOutOfRange);
  EXPECT_NE(old.status().message().find("compacted"), std::string::npos) << old.status().message();

  Seen seen;
  Watch w(cluster_->options(), "c/", etcd::prefix_end("c/"), *r1, seen.events_fn(), seen.error_fn());
  ASSERT_TRUE(wait_until([&] { return seen.error_count() > 0; }, 10'000));
  ASSERT_TRUE(wait_until([&] { return !w.running(); }, 2000));
  std::lock_guard<std::mutex> lock(seen.mu);
  ASSERT_EQ(seen.errors.size(), 1u);
  EXPECT_EQ(seen.errors[0].code(), Code::kDataLoss);
  EXPECT_NE(seen.errors[0].message().find("compacted at revision " + std::to_string(*r3)), std::string::npos)
      << seen.errors[0].message();
  EXPECT_TRUE(seen.events.empty());
}

// ---- three members ----

TEST_F(EtcdTest, ThreeMembersSurviveAKilledMemberCallsAndWatchesKeepWorking) {
  START_ETCD(3);
  ASSERT_EQ(cluster_->endpoints(), cluster_->endpoint(0) + "," + cluster_->endpoint(1) + "," + cluster_->endpoint(2));
  auto base = client_->range("ha/");
  ASSERT_TRUE(base.is_ok()) << base.status().to_string();

  Seen seen;
  Watch w(cluster_->options(), "ha/", etcd::prefix_end("ha/"), base->revision + 1, seen.events_fn(), seen.error_fn());
  auto r1 = client_->put("ha/1", "before");
  ASSERT_TRUE(r1.is_ok()) << r1.status().to_string();
  ASSERT_TRUE(wait_until([&] { return seen.count() >= 1; }, 10'000));

  // The client and the watch both talk to member 0 (the first endpoint, which answered): kill it.
  cluster_->kill(0);
  Result<int64_t> r2 = Status(Code::kUnavailable, "not tried");
  ASSERT_TRUE(wait_until(
      [&] {
        r2 = client_->put("ha/2", "after");
        return r2.is_ok();
      },
      15'000, 100))
      << r2.status().to_string();
  // Now every call works without waiting.
  auto got = client_->range("ha/", etcd::prefix_end("ha/"));
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->kvs.size(), 2u);
  auto t = client_->txn({Compare{"ha/3", Compare::Target::kCreateRevision, Compare::Result::kEqual, 0, ""}},
                        {Op::put("ha/3", "txn")});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_TRUE(t->succeeded);
  auto lease = client_->lease_grant(5);
  ASSERT_TRUE(lease.is_ok()) << lease.status().to_string();
  ASSERT_TRUE(client_->lease_keepalive(*lease).is_ok());

  // The watch reconnected elsewhere: the events after the kill arrive, none twice.
  ASSERT_TRUE(wait_until([&] { return !seen.snapshot().empty() && seen.snapshot().back().kv.key == "ha/3"; }, 10'000))
      << seen.count() << " events";
  const auto ev = seen.snapshot();
  EXPECT_EQ(ev.front().kv.key, "ha/1");
  EXPECT_EQ(ev.front().kv.mod_revision, *r1);
  for (size_t i = 1; i < ev.size(); ++i) EXPECT_LT(ev[i - 1].kv.mod_revision, ev[i].kv.mod_revision) << i;
  bool saw_r2 = false;
  for (const auto& e : ev) saw_r2 = saw_r2 || (e.kv.key == "ha/2" && e.kv.mod_revision == *r2);
  EXPECT_TRUE(saw_r2);
  EXPECT_EQ(ev.back().kv.mod_revision, t->revision);
  EXPECT_EQ(seen.error_count(), 0u);
  EXPECT_TRUE(w.running());

  // The killed member comes back with its data and catches up.
  ASSERT_TRUE(cluster_->restart(0)) << cluster_->error();
  etcd::Options only0;
  only0.endpoints = {cluster_->endpoint(0)};
  Client c0(only0);
  ASSERT_TRUE(wait_until(
      [&] {
        auto r = c0.range("ha/3");
        return r.is_ok() && r->kvs.size() == 1;
      },
      10'000, 50));
}

// ---- TLS (the etcd certificates of mc-auth init) ----

// Two clusters' keys, each with its etcd/ certificates (auth::init_dir, as `mc-auth init` makes them).
struct TwoClustersKeys {
  testkit::Scratch scratch{"etcd_tls"};
  std::string ours = scratch.path("ours"), theirs = scratch.path("theirs");
  TwoClustersKeys() {
    for (const std::string& dir : {ours, theirs}) {
      auth::InitOptions o;
      o.dir = dir;
      auto ids = auth::init_dir(o);
      EXPECT_TRUE(ids.is_ok()) << ids.status().to_string();
    }
  }
};

TEST(EtcdTlsFiles, InitWritesACaServerAndClientCertificateAndRefusesABadHost) {
  TwoClustersKeys keys;
  for (const char* f : {"ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key"}) {
    struct stat st {};
    ASSERT_EQ(::stat((keys.ours + "/etcd/" + f).c_str(), &st), 0) << f;
    EXPECT_GT(st.st_size, 100) << f;
    const bool secret = std::string(f).find(".key") != std::string::npos;
    EXPECT_EQ(st.st_mode & 0777, secret ? 0600u : 0644u) << f;
  }
  EXPECT_NE(testkit::slurp(keys.ours + "/etcd/server.pem"), testkit::slurp(keys.theirs + "/etcd/server.pem"));
  auto bad = etcd::write_tls_files(keys.scratch.path("bad"), {"127.0.0.1", "no spaces allowed"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
  EXPECT_NE(bad.message().find("no spaces allowed"), std::string::npos) << bad.message();
  EXPECT_EQ(etcd::write_tls_files(keys.scratch.path("bad"), {"::1"}, 0).code(), Code::kInvalidArgument);
}

TEST(EtcdTlsFiles, EndpointsFollowTheDefaultTlsFiles) {
  etcd::set_default_tls(etcd::tls_files_in("/keys/etcd"));
  auto https = etcd::parse_endpoints("127.0.0.1:2379,https://[::1]:2379");
  auto http = etcd::parse_endpoints("http://127.0.0.1:2379");
  etcd::set_default_tls({});
  ASSERT_TRUE(https.is_ok()) << https.status().to_string();
  EXPECT_EQ(https->endpoints, (std::vector<std::string>{"https://127.0.0.1:2379", "https://[::1]:2379"}));
  EXPECT_EQ(https->tls.ca_file, "/keys/etcd/ca.pem");
  EXPECT_EQ(https->tls.cert_file, "/keys/etcd/client.pem");
  EXPECT_EQ(https->tls.key_file, "/keys/etcd/client.key");
  ASSERT_FALSE(http.is_ok());
  EXPECT_NE(http.status().message().find("https://"), std::string::npos) << http.status().message();
  auto plain = etcd::parse_endpoints("127.0.0.1:2379");
  ASSERT_TRUE(plain.is_ok());
  EXPECT_FALSE(plain->tls.enabled());
}

// etcd started with the server certificate of our keys and --client-cert-auth: a client with our keys' files works
// (calls and a watch); plain HTTP, TLS without a client certificate, and another cluster's certificates are refused
// before any key is read or written.
TEST(EtcdTls, OurCertificatesGetInAndNothingElseDoes) {
  if (!EtcdCluster::installed()) GTEST_SKIP() << EtcdCluster::kNotInstalled;
  TwoClustersKeys keys;
  EtcdCluster cluster(1, "etcd_tls_member");
  cluster.use_tls(keys.ours + "/etcd");
  ASSERT_TRUE(cluster.start()) << cluster.error();
  Client ours(cluster.options());
  auto put = ours.put("tls/a", "secret");
  ASSERT_TRUE(put.is_ok()) << put.status().to_string();
  Seen seen;
  Watch w(cluster.options(), "tls/", etcd::prefix_end("tls/"), *put, seen.events_fn(), seen.error_fn());
  ASSERT_TRUE(ours.put("tls/b", "too").is_ok());
  ASSERT_TRUE(wait_until([&] { return seen.count() >= 2; }, 10'000)) << seen.count() << " events";
  EXPECT_EQ(seen.snapshot().at(0).kv.value, "secret");

  auto refused = [&](etcd::Options o, const char* who) {
    o.timeout_ms = 1000;
    Client c(o);
    auto r = c.range("tls/a");
    EXPECT_FALSE(r.is_ok()) << who << " read the key";
    auto p = c.put("tls/a", "forged");
    EXPECT_FALSE(p.is_ok()) << who << " wrote the key";
    return p.status().message();
  };
  etcd::Options plain = cluster.options();
  plain.tls = {};
  refused(plain, "plain HTTP");
  etcd::Options anonymous = cluster.options();
  anonymous.tls.cert_file.clear();
  anonymous.tls.key_file.clear();
  // Refused by etcd (which requires a client certificate), not by curl failing to load an empty certificate path.
  const std::string anonymous_why = refused(anonymous, "TLS without a client certificate");
  EXPECT_EQ(anonymous_why.find("local SSL certificate"), std::string::npos) << anonymous_why;
  EXPECT_EQ(anonymous_why.find("PEM"), std::string::npos) << anonymous_why;
  etcd::Options other = cluster.options();
  other.tls.cert_file = keys.theirs + "/etcd/client.pem";
  other.tls.key_file = keys.theirs + "/etcd/client.key";
  refused(other, "another cluster's client certificate");
  etcd::Options wrong_ca = cluster.options();
  wrong_ca.tls.ca_file = keys.theirs + "/etcd/ca.pem";
  const std::string why = refused(wrong_ca, "a client trusting another CA");
  EXPECT_NE(why.find("TLS to etcd failed"), std::string::npos) << why;

  auto got = ours.range("tls/a");
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "secret");
}

}  // namespace MC_UNITY_ID
}  // namespace mc
