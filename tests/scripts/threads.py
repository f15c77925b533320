"""Starts worker threads that each compute a sum, and joins them."""

import threading

results = {}


def work(n: int) -> None:
    results[n] = sum(range(n * 1000))


if __name__ == "__main__":
    threads = [threading.Thread(target=work, args=(n,), name=f"worker-{n}") for n in range(1, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"threads: {[results[n] for n in range(1, 4)]}")
