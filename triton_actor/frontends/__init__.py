"""Front ends: wire protocols in, data-plane calls, wire protocols out. Status codes live only here."""
