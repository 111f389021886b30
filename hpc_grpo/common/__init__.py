"""Building blocks every layer uses: errors and findings, YAML with line numbers, atomic writes."""
