// tetrad command-line entry point (placeholder until the subcommands land).
#include <cstdio>
int main() { std::puts("tetrad"); return 0; }
