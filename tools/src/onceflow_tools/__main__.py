from onceflow_tools.cli import main

main()
