// comm_stats.hpp: booking under nested scopes, sums by variable and policy.
#include "support.hpp"

TEST_CASE("CommStats books under the innermost scope and restores the outer one", "[comm_stats]") {
  px::CommStats s;
  s.add_sent(5, true);
  {
    auto a = s.scope("emb", "ShardedPS");
    s.add_sent(100, false);
    s.add_received(40, true);
    s.add_call();
    {
      auto b = s.scope("w", "RingAllReduce");
      CHECK(s.current() == px::CommStats::Key{"w", "RingAllReduce"});
      s.add_sent(7, true);
      s.add_call();
    }
    s.add_received(1, false);
  }
  s.add_call();
  CHECK(s.current() == px::CommStats::Key{"", ""});

  const px::Traffic emb = s.get("emb", "ShardedPS");
  CHECK(emb.sent_inter == 100);
  CHECK(emb.recv_intra == 40);
  CHECK(emb.recv_inter == 1);
  CHECK(emb.calls == 1);
  CHECK(s.get("w", "RingAllReduce").sent_intra == 7);
  CHECK(s.get("", "").sent() == 5);
  CHECK(s.get("", "").calls == 1);
  CHECK(s.total().sent() == 112);
  CHECK(s.total().received() == 41);
  CHECK(s.policy("ShardedPS") == emb);
  CHECK(s.variable("nothing") == px::Traffic{});
  CHECK_THAT(s.report(), Catch::Contains("emb") && Catch::Contains("ShardedPS"));

  s.reset();
  CHECK(s.total() == px::Traffic{});
}

TEST_CASE("Traffic arithmetic", "[comm_stats]") {
  px::Traffic a{1, 2, 3, 4, 5}, b{1, 1, 1, 1, 1};
  px::Traffic c = a;
  c += b;
  CHECK(c.sent() == 5);
  CHECK(c.received() == 9);
  CHECK(c - b == a);
}
