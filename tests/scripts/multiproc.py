"""Squares numbers in a multiprocessing pool; `--method spawn|fork` picks the start method."""

import argparse
import multiprocessing


def square(x: int) -> int:
    return x * x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", choices=["spawn", "fork"], required=True)
    method = parser.parse_args().method
    with multiprocessing.get_context(method).Pool(2) as pool:
        result = pool.map(square, range(6))
    print(f"multiproc {method}: {result}")


if __name__ == "__main__":
    main()
