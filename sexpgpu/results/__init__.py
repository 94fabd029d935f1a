"""Reading a store's runs for people: the runs table (`sexpgpu runs`, the dashboard's first
page), each run's curves (every logged series against step), and plots of them. Only
readers: nothing here writes to a store, and nothing here knows Lisp or the compiler."""
