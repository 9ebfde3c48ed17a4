from cronjob.cli import main

main()
