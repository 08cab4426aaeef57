"""What the tests and the benchmarks run adapterd against, shared by both and shipped by neither:
the local Hub stand-in (`hub_server`), the daemon as an operator or systemd starts it
(`processes`), a client of its topics (`client`), and the ids and rows they publish (`data`)."""
